"""Every README and docs command works as written: the newcomer's walk, made a test.

See ``tests/readme_walk.py`` for what runs, what is skipped and why, and the small-size overrides.
``python tests/readme_walk.py [PAGE ...]`` walks the README (or the pages given) by hand."""

from __future__ import annotations

import os

import pytest

from tests.readme_walk import REPO, doc_pages, make_layout, readme_commands, summary, walk

pytestmark = pytest.mark.integration

walk_switch = pytest.mark.skipif(
    os.environ.get("FINETUNE_README_WALK") == "0",
    reason="FINETUNE_README_WALK=0: the README walk is switched off (it takes ~15 min on 2 cores)")
DOC_PAGES = doc_pages()


@walk_switch
def test_every_readme_command_runs(tmp_path):
    results = walk(readme_commands((REPO / "README.md").read_text()), make_layout(tmp_path))
    report = summary(results)
    print(report)
    assert sum(r.status == "ran" for r in results) >= 10, report
    assert not [r for r in results if r.status == "failed"], report


@walk_switch
@pytest.mark.parametrize("page", DOC_PAGES, ids=[p.relative_to(REPO).as_posix() for p in DOC_PAGES])
def test_every_docs_command_runs(page, tmp_path):
    """The docs pages' commands, with the README's markers and small sizes; each page in a fresh layout."""
    name = page.relative_to(REPO).as_posix()
    results = walk(readme_commands(page.read_text()), make_layout(tmp_path))
    report = summary(results, name)
    print(report)
    assert not [r for r in results if r.status == "failed"], report


def test_a_broken_readme_command_fails_the_walk(tmp_path):
    """The walker itself: a command that fails is reported with its README line; markers skip."""
    text = "\n".join([
        "# doc", "", "```", "finetune nonsense   # a synopsis fence: not run", "```", "",
        "```bash",
        "# a comment line",
        "finetune recipes validate quickstart \\",
        "  train.lr=1e-4            # runs",
        "finetune recipes show nosuch   # fails: no such recipe",
        "finetune augment --backtranslate -i a.tsv -o b.tsv   # needs: hub",
        "make test",
        "python -c 'print(1)'   # walk: skip (shown only)",
        "```",
    ])
    cmds = readme_commands(text)
    assert [c.line for c in cmds] == [9, 11, 12, 13, 14]
    assert cmds[0].text == "finetune recipes validate quickstart train.lr=1e-4"
    res = walk(cmds, make_layout(tmp_path))
    assert [r.status for r in res] == ["ran", "failed", "skipped", "skipped", "skipped"], summary(res)
    assert "FAILED README.md:11: finetune recipes show nosuch" in summary(res)
    assert "recipe file not found: nosuch" in res[1].output
