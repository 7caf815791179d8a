"""The one training loop (masklab.lab.train) and the one weight-decay rule (masklab.models.optim)."""

import pytest
import torch
import torch.nn.functional as F

from masklab.priors.bias import ALiBi, MaskPrior
from masklab.models import GPT, ViT, TokenEncoder, param_groups
from masklab.models.reader import EvidenceReader
from masklab.lab.runner import Checkpoint, MasklabError, read_json, seed_everything, warmup_cosine
from masklab.lab.train import Recipe, priors_for, steps_to, train

# ----------------------------------------------------------------------------- weight decay


def decayed_names(model: torch.nn.Module, wd: float = 0.1) -> set[str]:
    groups = param_groups(model, wd)
    ids = {id(q) for q in groups[0]["params"]}
    assert groups[0]["weight_decay"] == wd and groups[1]["weight_decay"] == 0.0
    return {n for n, q in model.named_parameters() if id(q) in ids}


def linear_weights(model: torch.nn.Module) -> set[str]:
    return {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def test_weight_decay_only_on_linear_weights_and_token_embeddings():
    prior = MaskPrior(torch.ones(5, 5))
    enc = TokenEncoder(2, 4, dim=8, depth=1, heads=2, priors=[prior])
    assert decayed_names(enc) == linear_weights(enc) | {"tok.weight"}

    gpt = GPT(11, 6, dim=8, depth=2, heads=2, priors=[MaskPrior(torch.ones(6, 6)), None])
    names = decayed_names(gpt)
    assert names == (linear_weights(gpt) - {"head.weight"}) | {"tok.weight"}  # the tied head is tok.weight

    vit = ViT(8, 2, 1, 3, dim=8, depth=1, heads=2, priors=[MaskPrior(torch.ones(17, 17))])
    assert decayed_names(vit) == linear_weights(vit)

    reader = EvidenceReader(10, 4, dim=8, depth=1, heads=2, recency=True)
    assert decayed_names(reader) == linear_weights(reader) | {"sym.weight"}  # not the position table


@pytest.mark.parametrize("mode", ["learnable", "hard"])
def test_no_prior_bias_norm_or_position_gets_weight_decay(mode):
    model = GPT(11, 6, dim=8, depth=1, heads=2, priors=[MaskPrior(torch.ones(6, 6), mode=mode)])
    names = decayed_names(model)
    every = {n for n, q in model.named_parameters() if q.requires_grad}
    assert names and names < every
    for n in names:
        assert not (n.endswith(".bias") or ".ln" in n or n.startswith("ln") or "prior" in n or n == "pos"), n
    assert {"blocks.0.attn.prior.m", "pos", "blocks.0.ln1.weight", "blocks.0.attn.q.bias"} <= every - names


def test_frozen_parameters_are_left_out_of_the_optimiser():
    model = GPT(11, 6, dim=8, depth=1, heads=2, priors=[MaskPrior(torch.ones(6, 6), mode="frozen")])
    grouped = {id(q) for g in param_groups(model, 0.1) for q in g["params"]}
    assert id(model.blocks[0].attn.prior.m) not in grouped
    assert grouped == {id(q) for q in model.parameters() if q.requires_grad}


# ----------------------------------------------------------------------------- the loop


def parity_setup(mode: str = "learnable", seed: int = 0):
    """A 1-block encoder with a MaskPrior on 2-bit parity of 4 variables, its data and generator."""
    gen = seed_everything(seed)
    priors = priors_for(
        {"learnable": "mask", "frozen": "mask-frozen", "hard": "mask-hard"}[mode], [torch.eye(5)], 4.0, 4.0
    )
    model = TokenEncoder(2, 4, dim=16, depth=1, heads=2, priors=priors)
    x = torch.tensor([[(i >> b) & 1 for b in range(4)] for i in range(16)])
    y = (1 - 2 * x[:, 0]) * (1 - 2 * x[:, 1]) * 1.0

    def loss_of(net, step):
        idx = torch.randint(16, (8,), generator=gen)
        return F.mse_loss(net(x[idx])[0][:, 0], y[idx])

    def evaluate(step):
        return {"mse": float(F.mse_loss(model(x)[0][:, 0], y))}

    return model, loss_of, evaluate, gen


RECIPE = Recipe(steps=12, lr=3e-3, weight_decay=0.1, warmup=0.25, floor=0.1, evals=4)


def test_curves_cadence_and_lr_schedule_follow_the_recipe(tmp_path, monkeypatch):
    lrs = []
    step = torch.optim.AdamW.step

    def recording_step(self, *args, **kwargs):
        lrs.append([g["lr"] for g in self.param_groups])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    model, loss_of, evaluate, gen = parity_setup()
    out = train(model, RECIPE, loss_of, evaluate, gen, tmp_path, "parity/mask")
    assert out.curves["step"] == [0, 3, 6, 9, 12] and out.resumed_from == 0
    assert out.curves["train_loss"][0] is None and all(v > 0 for v in out.curves["train_loss"][1:])
    assert len(out.curves["mse"]) == len(out.curves["mask_drift"]) == 5
    expected = [warmup_cosine(s, 12, 3e-3, 3, 0.1) for s in range(12)]
    assert lrs == [[lr, lr] for lr in expected]  # bit for bit, both groups
    assert not Checkpoint(tmp_path).exists  # cleared at the end


def test_killed_training_resumes_with_identical_results(tmp_path, monkeypatch):
    model, loss_of, evaluate, gen = parity_setup()
    full = train(model, RECIPE, loss_of, evaluate, gen, tmp_path / "full", "parity/mask")
    original = Checkpoint.save
    saves = {"n": 0}

    def save_then_die(self, *args, **kwargs):
        original(self, *args, **kwargs)
        saves["n"] += 1
        if saves["n"] == 2:  # killed right after the step-6 checkpoint, inside the cosine part
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "save", save_then_die)
    killed, loss_of2, evaluate2, gen2 = parity_setup()
    with pytest.raises(KeyboardInterrupt):
        train(killed, RECIPE, loss_of2, evaluate2, gen2, tmp_path / "killed", "parity/mask")
    assert read_json(tmp_path / "killed" / "ckpt.json")["step"] == 6
    monkeypatch.setattr(Checkpoint, "save", original)
    fresh, loss_of3, evaluate3, gen3 = parity_setup(seed=5)  # a new process: different state until resumed
    resumed = train(fresh, RECIPE, loss_of3, evaluate3, gen3, tmp_path / "killed", "parity/mask")
    assert resumed.resumed_from == 6
    assert resumed.curves == full.curves
    for (n, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), n


def test_nan_loss_raises_a_masklab_error_naming_the_run(tmp_path):
    model, loss_of, evaluate, gen = parity_setup()

    def nan_at_step_2(net, step):
        loss = loss_of(net, step)
        return loss * float("nan") if step == 2 else loss

    with pytest.raises(MasklabError, match=r"at step 2 \(2parity/mask\); lower --lr"):
        train(model, RECIPE, nan_at_step_2, evaluate, gen, tmp_path, "2parity/mask")


def test_learnable_prior_moves_and_frozen_prior_does_not(tmp_path):
    drift = {}
    for mode in ("learnable", "frozen"):
        model, loss_of, evaluate, gen = parity_setup(mode)
        prior = model.blocks[0].attn.prior
        out = train(model, RECIPE, loss_of, evaluate, gen, tmp_path / mode, f"parity/{mode}")
        assert out.curves["mask_drift"][0] == 0.0
        drift[mode] = (out.curves["mask_drift"][-1], torch.equal(prior.m, prior.m0))
    assert drift["learnable"][0] > 0 and not drift["learnable"][1]
    assert drift["frozen"] == (0.0, True)


# ----------------------------------------------------------------------------- helpers


def test_priors_from_the_method_name():
    s = [torch.eye(4)[None].expand(2, -1, -1)] * 3
    assert priors_for("vanilla", s) is None and priors_for("qk-svd", s) is None
    modes = {m: [p.mode for p in priors_for(m, s)] for m in ("mask", "mask-frozen", "mask-hard", "mask-nopos")}
    assert modes == {
        "mask": ["learnable"] * 3,
        "mask-frozen": ["frozen"] * 3,
        "mask-hard": ["hard"] * 3,
        "mask-nopos": ["learnable"] * 3,
    }
    alibi = priors_for("alibi", s)
    assert len(alibi) == 3 and all(isinstance(p, ALiBi) and len(p.slopes) == 2 for p in alibi)


def test_mask_zero_is_the_mask_prior_without_its_structure(tmp_path):
    """mask-zero: the learnable parameters of ``mask`` (shape, optimiser group, no decay) with
    a uniform bias, so at init the model computes exactly what vanilla computes."""
    from masklab.priors.structures import relative_distance
    from masklab.lab.studies import lm, vision

    T, H = 8, 2
    s = [relative_distance(T, H)] * 2
    mask, zero = priors_for("mask", s), priors_for("mask-zero", s)
    for m, z in zip(mask, zero):
        assert isinstance(z, MaskPrior) and z.mode == "learnable" and z.m.requires_grad
        assert z.m.shape == m.m.shape and torch.equal(z.m, torch.zeros_like(z.m))
        bias = z(T)
        assert torch.equal(bias, bias[..., :1].expand_as(bias))  # the same for every key
    assert priors_for("mask-zero", [torch.eye(5)])[0].m.shape == (1, 5, 5)  # a (T, T) structure: one shared M

    def gpt(method):
        torch.manual_seed(0)  # MaskPrior draws nothing, so every method gets the same weights
        return GPT(11, T, dim=8, depth=2, heads=H, priors=priors_for(method, s))

    x = torch.randint(11, (3, T))
    vanilla = gpt("vanilla")(x)[0]
    assert torch.allclose(gpt("mask-zero")(x)[0], vanilla, atol=1e-6)  # uniform bias: softmax unchanged
    assert not torch.allclose(gpt("mask")(x)[0], vanilla, atol=1e-3)  # the structured prior is not
    for method in ("mask", "mask-zero"):
        model = gpt(method)
        prior_ids = {id(b.attn.prior.m) for b in model.blocks}
        no_decay = {id(q) for q in param_groups(model, 0.1)[1]["params"]}
        assert prior_ids <= no_decay  # the same group as mask's M: trained, never decayed
        gen = torch.Generator().manual_seed(0)
        train(
            model,
            Recipe(steps=3, lr=1e-2, evals=1),
            lambda net, step: net(x)[0].square().mean(),
            lambda step: {},
            gen,
            tmp_path / method,
            method,
        )
        assert all(b.attn.prior.drift() > 0 for b in model.blocks)  # learnable: it moves
    assert "mask-zero" in lm.reproduce_config().methods and "mask-zero" in vision.reproduce_config().methods


def test_steps_to_threshold():
    steps, acc = [0, 10, 20, 30], [0.5, 0.99, 0.8, 0.995]
    assert steps_to(steps, acc, 0.99) == 10
    assert steps_to(steps, acc, 0.99, stay=True) == 30
    assert steps_to(steps, [0.1, 0.2, 0.995, 0.5], 0.99, stay=True) is None
    assert steps_to(steps, [20.0, 9.0, 7.5, 8.5], 8.0, above=False) == 20
