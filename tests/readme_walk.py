"""Walk the README as a newcomer would: extract its shell commands and run them, in order, in a
fresh copy of the project's layout, with small-size overrides so the walk takes minutes. The docs
pages (``docs/*.md``, ``docs/design/*.md``) are walked the same way, each page in a fresh layout of
its own, so a page's commands may use what its earlier commands made but nothing from another page.

Which commands run:
- every command in a ```bash fence (continuation lines joined; comment-only lines dropped); fences
  without a language (the synopsis at the top) are not commands to run;
- a command whose line carries ``# needs: hub`` or ``# needs: gpu`` is skipped with that reason (the
  Hugging Face hub is unreachable here and the tests never need a GPU); ``# needs: data`` (or any
  mention of ``../shared/data``) runs only when the shared data folder exists; ``# walk: skip
  (reason)`` skips with the reason given;
- the same markers in an HTML comment on the line just before a fence (``<!-- walk: skip (reason)
  -->``, ``<!-- needs: data -->``) apply to every command of that fence, and a reader of the
  rendered page does not see them (the README uses this form);
- ``make quickstart`` runs the commands of the Makefile's ``quickstart`` target at the small sizes
  below (the venv is the one running the tests; ``tests/integration/test_quickstart.py`` trains the
  main job at full size); ``make test`` and other test/lint targets are the suite itself and are
  skipped.

Small sizes: ``finetune train`` and ``finetune probe`` commands get overrides appended (two
optimizer steps, a few dozen examples); nothing else is changed. Everything runs through ``bash`` with
the test's virtualenv first on ``PATH``, ``HF_HUB_OFFLINE=1`` and a private ``FINETUNE_CACHE``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SHARED = Path(os.environ.get("FINETUNE_SHARED_DATA", REPO.parent / "shared" / "data"))

TRAIN_CAPS = ("train.max_steps=2", "train.eval_every=2", "data.max_eval_samples=48")
PROBE_CAPS = ("train.max_steps=2",)
PROBE_TASK_CAPS = ("data.max_train_samples=48", "data.max_eval_samples=32")
_MARK = re.compile(r"(needs:\s*(hub|gpu|data)|walk:\s*skip\s*\(([^)]*)\))")
_HIDDEN = re.compile(r"^\s*<!--(.*)-->\s*$")  # a line that is one HTML comment


@dataclass
class Command:
    line: int  # 1-based line of the README where it starts
    text: str  # the command as written (continuations joined, trailing comment removed)
    needs: list[str] = field(default_factory=list)  # hub, gpu, data
    skip: Optional[str] = None  # `walk: skip (reason)`


def _strip_comment(line: str) -> str:
    """Drop a trailing `# comment` outside quotes (a `#` must follow whitespace to start one)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def readme_commands(text: str) -> list[Command]:
    out: list[Command] = []
    fence: Optional[str] = None
    pending: Optional[Command] = None
    before = ""  # the line before the current one (outside a fence: maybe a hidden marker)
    hidden = ""  # the hidden markers of the fence being read
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            opening = fence is None
            fence = (stripped[3:].strip() or "plain") if opening else None
            m = _HIDDEN.match(before) if opening else None
            hidden = m.group(1) if m else ""
            pending = None
            before = raw
            continue
        before = raw
        if fence != "bash" or not stripped or (stripped.startswith("#") and pending is None):
            continue
        cmd = pending or Command(line=n, text="")
        body = _strip_comment(raw)
        for m in _MARK.finditer(raw[len(body):] + " " + hidden):  # in the line's comment, or the fence's
            if m.group(2) and m.group(2) not in cmd.needs:
                cmd.needs.append(m.group(2))
            else:
                cmd.skip = m.group(3).strip() or "marked"
        cont = body.endswith("\\")
        cmd.text = (cmd.text + " " + body.rstrip("\\").strip()).strip()
        if cont:
            pending = cmd
            continue
        pending = None
        if "../shared/data" in cmd.text and "data" not in cmd.needs:
            cmd.needs.append("data")
        out.append(cmd)
    return out


def doc_pages(docs: Path = DOCS) -> list[Path]:
    """The docs pages whose commands are walked: ``docs/*.md`` and ``docs/design/*.md`` (working
    notes and generated pages elsewhere are not)."""
    return sorted(docs.glob("*.md")) + sorted((docs / "design").glob("*.md"))


def makefile_target(target: str) -> list[str]:
    """The shell lines of a Makefile target, with ``$(BIN)/`` made a PATH lookup."""
    lines, inside = [], False
    for raw in (REPO / "Makefile").read_text().splitlines():
        if re.match(rf"^{re.escape(target)}\s*:", raw):
            inside = True
            continue
        if inside:
            if raw.startswith("\t"):
                lines.append(raw.strip().replace("$(BIN)/", ""))
            elif raw.strip():
                break
    return lines


def probe_tasks() -> list[str]:
    import yaml

    data = yaml.safe_load((REPO / "recipes" / "probe_sequential.yaml").read_text())
    return list((data.get("probe") or {}).get("tasks") or {})


def with_caps(cmd: str) -> str:
    """Append the small-size overrides to a plain `finetune train|probe` command. Quality gates
    (``--expect``) are about the real model, so those commands run as written."""
    if re.search(r"[;|&<>]|\bfor\b", cmd) or "--expect" in cmd:
        return cmd
    if cmd.startswith("finetune train"):
        caps = list(TRAIN_CAPS)
        if not re.search(r"few_?shot", cmd) and "max_train_samples" not in cmd:  # few_shot excludes it
            caps.append("data.max_train_samples=64")
        return f"{cmd} {' '.join(caps)}"
    if cmd.startswith("finetune probe"):
        caps = list(PROBE_CAPS) + [f"probe.tasks.{t}.{c}" for t in probe_tasks() for c in PROBE_TASK_CAPS]
        return f"{cmd} {' '.join(caps)}"
    return cmd


@dataclass
class Outcome:
    command: Command
    status: str  # ran, failed, skipped
    reason: str = ""
    seconds: float = 0.0
    output: str = ""


def make_layout(root: Path) -> Path:
    """``root/work`` (the working directory: the repo's recipes/, experiments/, scripts/ and bench/
    linked in) beside ``root/shared`` (linked to the shared data, when it exists)."""
    work = root / "work"
    work.mkdir(parents=True)
    for name in ("recipes", "experiments", "scripts", "bench", "examples", "Makefile"):
        if (REPO / name).exists():
            (work / name).symlink_to(REPO / name)
    if SHARED.is_dir():
        (root / "shared").mkdir()
        (root / "shared" / "data").symlink_to(SHARED)
    return work


def walk(commands: list[Command], work: Path, *, timeout: float = 600.0) -> list[Outcome]:
    env = {k: v for k, v in os.environ.items() if k not in ("FINETUNE_DATA_DIR", "PYTEST_CURRENT_TEST")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1", CI="1",
               TOKENIZERS_PARALLELISM="false", FINETUNE_CACHE=str(work.parent / "cache"), MPLBACKEND="Agg")
    results = []
    for c in commands:
        if c.skip:
            results.append(Outcome(c, "skipped", c.skip))
            continue
        if "hub" in c.needs or "gpu" in c.needs:
            what = "the Hugging Face hub" if "hub" in c.needs else "a GPU"
            results.append(Outcome(c, "skipped", f"needs {what}"))
            continue
        if "data" in c.needs and not SHARED.is_dir():
            results.append(Outcome(c, "skipped", f"needs {SHARED}"))
            continue
        script = [c.text]
        if c.text.startswith("make "):
            target = c.text.split()[1]
            if target != "quickstart":
                results.append(Outcome(c, "skipped", f"`make {target}` is the test suite or its set-up"))
                continue
            # as the Makefile has it, at the walk's small size: the main job at full size (its learning
            # included) is tests/integration/test_quickstart.py's, not trained twice
            script = [with_caps(line) for line in makefile_target("quickstart")]
        t0 = time.perf_counter()
        ok, out = True, ""
        for line in script:
            try:
                run = line if c.text.startswith("make ") else with_caps(line)
                p = subprocess.run(["bash", "-c", run], cwd=work, env=env, capture_output=True,
                                   text=True, timeout=timeout, stdin=subprocess.DEVNULL)
                ok, out = p.returncode == 0, (p.stdout + p.stderr)[-2000:]
            except subprocess.TimeoutExpired:
                ok, out = False, f"timed out after {timeout:.0f} s"
            if not ok:
                break
        results.append(Outcome(c, "ran" if ok else "failed", seconds=time.perf_counter() - t0, output=out))
    return results


def summary(results: list[Outcome], page: str = "README.md") -> str:
    """What ran, failed and was skipped; ``page`` (as the lines name it) is the walked file."""
    ran = [r for r in results if r.status == "ran"]
    failed = [r for r in results if r.status == "failed"]
    skipped = [r for r in results if r.status == "skipped"]
    title = "README" if page == "README.md" else page
    lines = [f"{title} walk: {len(ran)} ran, {len(failed)} failed, {len(skipped)} skipped "
             f"in {sum(r.seconds for r in results):.0f} s"]
    for r in failed:
        lines.append(f"FAILED {page}:{r.command.line}: {r.command.text}\n{r.output}")
    for r in skipped:
        lines.append(f"skipped {page}:{r.command.line}: {r.reason}: {r.command.text[:90]}")
    return "\n".join(lines)


if __name__ == "__main__":
    # python tests/readme_walk.py [PAGE ...]: walk the README (or the pages given, e.g. docs/evaluation.md,
    # or `docs` for every docs page), each in a temporary folder of its own
    import tempfile

    args = sys.argv[1:] or ["README.md"]
    pages = [p for a in args for p in (doc_pages() if a == "docs" else [(REPO / a).resolve()])]
    failed = False
    for page in pages:
        root = Path(tempfile.mkdtemp(prefix="readme-walk-"))
        try:
            res = walk(readme_commands(page.read_text()), make_layout(root))
            print(summary(res, page.relative_to(REPO).as_posix()))
            failed = failed or any(r.status == "failed" for r in res)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)
