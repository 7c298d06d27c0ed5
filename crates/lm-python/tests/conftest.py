"""Shared fixtures: SmolLM2 (the catalog's `smollm2`, Q4_1) loaded once, and lm-cli's expectations.

A missing model fails every test that needs it, naming the command that installs it; it never skips.
"""

import json
import os
from pathlib import Path

import pytest

import lm

FIXTURES = Path(__file__).parent / "fixtures"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def models_dir():
    """The catalog's models folder: $LM_MODELS_DIR, else ~/.cache/lm/models (as lm_model::catalog)."""
    return Path(os.environ.get("LM_MODELS_DIR") or Path.home() / ".cache/lm/models")


@pytest.fixture(scope="session")
def smollm2_path():
    path = models_dir() / SMOLLM2_FILE
    if not path.is_file():
        pytest.fail(f"needs SmolLM2 at {path}: cargo xtask fetch-model smollm2")
    return path


@pytest.fixture(scope="session")
def model(smollm2_path):
    return lm.load(str(smollm2_path), threads=2)


@pytest.fixture(scope="session")
def expected():
    """lm-cli's results on SmolLM2 (tests/make_fixture.py writes them)."""
    return json.loads((FIXTURES / "smollm2.json").read_text())


@pytest.fixture(scope="session")
def no_end(model):
    """A logit bias that keeps the end tokens from being chosen, so a run lasts max_new_tokens."""
    return {token: -100.0 for token in model.end_ids}
