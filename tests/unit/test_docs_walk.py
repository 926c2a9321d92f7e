"""The docs walk's pieces: which pages it walks, what it extracts from one, and how it reports."""

from __future__ import annotations

import re

from tests.readme_walk import DOCS, REPO, doc_pages, make_layout, readme_commands, summary, walk

FAKE_PAGE = """# Evaluation

Prose with an inline `finetune eval runs/x` that is not a command.

```
finetune eval RUN   # a synopsis fence (no language): not run
```

```yaml
train:
  lr: 3e-5
```

```bash
# a comment line
finetune train --recipe quickstart \\
  train.lr=1e-4              # joined into one command
finetune eval runs/quickstart --data-dir ../shared/data
finetune train -r recipes/scl.yaml   # needs: hub
finetune train -r recipes/scl.yaml --device cuda   # needs: gpu
python -c 'print("#not a comment")'  # walk: skip (prints only)
```

```console
$ finetune recipes list
```
"""


def test_extractor_on_a_fake_docs_page():
    cmds = readme_commands(FAKE_PAGE)
    assert [c.line for c in cmds] == [16, 18, 19, 20, 21]
    assert cmds[0].text == "finetune train --recipe quickstart train.lr=1e-4"
    assert cmds[0].needs == [] and cmds[0].skip is None
    assert cmds[1].needs == ["data"]  # mentions ../shared/data
    assert cmds[2].needs == ["hub"] and cmds[3].needs == ["gpu"]
    assert cmds[4].skip == "prints only" and cmds[4].text == "python -c 'print(\"#not a comment\")'"


def test_docs_pages_are_the_topic_and_design_pages(tmp_path):
    docs = tmp_path / "docs"
    for rel in ("index.md", "errors.md", "design/speed.md", "notes/old.md", "reference/cli.md", "logo.png"):
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text("# x\n")
    assert [p.relative_to(docs).as_posix() for p in doc_pages(docs)] == ["errors.md", "index.md", "design/speed.md"]
    assert all(p.parent in (DOCS, DOCS / "design") for p in doc_pages())


def test_a_docs_page_walk_names_the_page(tmp_path):
    """Outcomes and the summary name the page and line; a failure does not stop the next command."""
    page = "```bash\ntrue\nfalse   # fails\nfinetune recipes show quickstart   # needs: hub\nexit 0\n```\n"
    res = walk(readme_commands(page), make_layout(tmp_path))
    assert [r.status for r in res] == ["ran", "failed", "skipped", "ran"]
    report = summary(res, "docs/fake.md")
    assert report.startswith("docs/fake.md walk: 2 ran, 1 failed, 1 skipped")
    assert "FAILED docs/fake.md:3: false" in report
    assert "skipped docs/fake.md:4: needs the Hugging Face hub" in report
    assert summary(res).startswith("README walk:")  # the README's report is unchanged


def test_a_hidden_marker_before_a_fence_applies_to_its_commands():
    """``<!-- walk: skip (…) -->`` / ``<!-- needs: … -->`` on the line before a fence: every command of
    that fence carries it (continuations included); the next fence does not."""
    text = "\n".join([
        "<!-- walk: skip (downloads torch) -->",
        "```bash",
        "pip install torch \\",
        "  --index-url https://download.pytorch.org/whl/cpu",
        "echo two",
        "```",
        "",
        "<!-- needs: data -->",
        "```bash",
        "finetune train -r ce",
        "```",
        "<!-- an ordinary comment -->",
        "",
        "```bash",
        "finetune recipes list   # walk: skip (inline still works)",
        "finetune recipes show quickstart",
        "```",
    ])
    cmds = readme_commands(text)
    assert [(c.text, c.skip, c.needs) for c in cmds] == [
        ("pip install torch --index-url https://download.pytorch.org/whl/cpu", "downloads torch", []),
        ("echo two", "downloads torch", []),
        ("finetune train -r ce", None, ["data"]),
        ("finetune recipes list", "inline still works", []),
        ("finetune recipes show quickstart", None, []),
    ]


def test_the_readme_keeps_the_walk_markers_out_of_sight():
    """A reader of the README sees no walk markers in its commands: they sit in HTML comments."""
    fence, shown = None, []
    for n, line in enumerate((REPO / "README.md").read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            fence = None if fence else line.strip()[3:] or "plain"
        elif fence and re.search(r"#\s*(walk:|needs:)", line):
            shown.append(f"README.md:{n}: {line}")
    assert not shown, "\n".join(shown)
    assert [c for c in readme_commands((REPO / "README.md").read_text()) if c.skip]  # the markers are still read
