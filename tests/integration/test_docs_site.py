"""The docs site builds in strict mode (what `make docs` runs), offline, with the generated reference.

Skipped where MkDocs is not installed (the `docs` extra is not part of `dev`); CI runs `make docs`,
which installs it, either way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_strict_build(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(site)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (site / "index.html").is_file() and not (site / "notes").exists()
    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    assert 'id="finetune-train"' in cli and "--recipe" in cli
    recipe = (site / "reference" / "recipe.html").read_text(encoding="utf-8")
    assert 'id="objective-scl"' in recipe and "train.lr" in recipe
    # Nothing is fetched from another host when a page is opened (fonts, scripts, styles).
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert not re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="https?://', text), page
