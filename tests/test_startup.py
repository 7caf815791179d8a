"""Start-up: `import masklab` loads no torch, so a Ctrl-C while the command starts is caught
by the entry point (one line, exit 130) rather than by a 40-line traceback from torch's import."""

import subprocess
import sys


def test_importing_masklab_loads_no_torch_and_names_still_resolve():
    code = (
        "import sys, masklab; assert 'torch' not in sys.modules; "
        "from masklab import Attention, MasklabError, run_study; assert 'torch' in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_an_interrupt_while_the_cli_imports_is_one_line(monkeypatch, capsys):
    import builtins

    import masklab.__main__ as entry

    real = builtins.__import__

    def interrupted(name, *a, **k):
        if name == "masklab.cli":
            raise KeyboardInterrupt
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    monkeypatch.delitem(sys.modules, "masklab.cli", raising=False)
    assert entry.run() == 130
    assert capsys.readouterr().err == "masklab: interrupted\n"
