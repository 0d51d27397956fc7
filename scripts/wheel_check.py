"""Install leasekeeper as a user does, and check that what they get works (scripts/wheel-check).

1. Build the sdist, and the wheel from the sdist (``python -m build``), so a file missing from
   the sdist fails here too, from a copy of the tree as a fresh clone has it.
2. ``twine check --strict`` both, and read the wheel's metadata: the version is
   ``workerproc.__version__``, the extras and the description are there.
3. The wheel holds the package data: every template and static file of the dashboard, the
   store's named queries (``.sql``), both ``py.typed`` markers and the license.
4. Install the wheel with its extras into a fresh virtual environment, then, with only that
   environment on PATH: the version matches the metadata, the tutorial and the README's first
   run work as written (tests/support/docs_blocks.py), and the dashboard serves a page and a
   static file.

Prints one PASS line per check and the time it took; exits 1 at the first failure.
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = "postgres,web"


class CheckFailed(Exception):
    pass


def run(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT,
        timeout: float = 600) -> str:  # fmt: skip
    done = subprocess.run(
        list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise CheckFailed(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done.stdout


def source_version() -> str:
    tree = ast.parse((ROOT / "workerproc" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise CheckFailed("workerproc/__init__.py has no __version__")


def clean_tree(into: Path) -> Path:
    """The project as a fresh clone has it: the files git tracks or would track, as they are
    in the working tree, and nothing it ignores (no ``*.egg-info`` whose file list setuptools
    would reuse, no ``.venv``)."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def build(dist: Path, tree: Path) -> tuple[Path, Path]:
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(tree)])
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def check_metadata(sdist: Path, wheel: Path) -> None:
    run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)])
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(zf.read(name).decode())
    version = source_version()
    if meta["Version"] != version:
        raise CheckFailed(f"the wheel says {meta['Version']}, workerproc.__version__ {version}")
    extras = set(meta.get_all("Provides-Extra") or [])
    if not {"postgres", "web"} <= extras:
        raise CheckFailed(f"extras missing from the metadata: {extras}")
    for field in ("Summary", "Author", "Keywords", "License-Expression", "Requires-Python"):
        if not meta[field]:
            raise CheckFailed(f"no {field} in the wheel's metadata")
    if not meta.get_all("Classifier"):
        raise CheckFailed("no classifiers in the wheel's metadata")
    if meta["Description-Content-Type"] != "text/markdown" or "# leasekeeper" not in (
        meta.get_payload() or ""
    ):
        raise CheckFailed("the long description is not the README")


def check_package_data(wheel: Path) -> int:
    wanted = {
        p.relative_to(ROOT).as_posix()
        for d in (
            "supervisor/web/templates",
            "supervisor/web/static",
            "workerproc/store/sqlite/queries",
            "workerproc/store/postgres/queries",
        )
        for p in (ROOT / d).rglob("*")
        if p.is_file()
    }
    wanted |= {"workerproc/py.typed", "supervisor/py.typed"}
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = sorted(wanted - names)
    if missing:
        raise CheckFailed(f"missing from the wheel: {', '.join(missing)}")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        raise CheckFailed("the wheel carries no LICENSE")
    stray = sorted(n for n in names if n.split("/")[0] in ("tests", "scripts", "docs", "deploy"))
    if stray:
        raise CheckFailed(f"the wheel carries files users do not need: {stray[:5]}")
    return len(wanted)


def user_env(venv: Path) -> dict[str, str]:
    """A user's shell with only the fresh environment's tools: nothing of this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    dev_bin = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != dev_bin]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    return env


def install(wheel: Path, venv: Path) -> None:
    run([sys.executable, "-m", "venv", str(venv)])
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    run([*pip, f"{wheel}[{EXTRAS}]"], env=user_env(venv))


def check_installed(venv: Path, work: Path) -> str:
    code = (
        "import importlib.metadata as m, psycopg, starlette, workerproc\n"
        "print(m.version('leasekeeper'), workerproc.__version__, workerproc.__file__)"
    )
    out = run([str(venv / "bin" / "python"), "-c", code], env=user_env(venv), cwd=work).split()
    if out[0] != out[1] or out[0] != source_version():
        raise CheckFailed(f"installed versions disagree: {out[:2]}")
    if not out[2].startswith(str(venv)):
        raise CheckFailed(f"workerproc was imported from {out[2]}, not the fresh environment")
    return out[0]


def check_pages(venv: Path, pages: Sequence[str]) -> str:
    runner = ROOT / "tests" / "support" / "docs_blocks.py"
    return run([str(venv / "bin" / "python"), str(runner), *pages], env=user_env(venv)).strip()


def check_dashboard(venv: Path, work: Path) -> str:
    env = user_env(venv)
    db = work / "web.db"
    run(["supervisor", "enqueue", "hello", "--db", str(db)], env=env, cwd=work)
    proc = subprocess.Popen(
        ["supervisor", "web", "--db", str(db), "--port", "0"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "dashboard on http://127.0.0.1:PORT/ (...)", once bound
        url = re.search(r"(http://\S+/)", line)
        if url is None:
            raise CheckFailed(f"supervisor web printed {line!r}, not where it listens")
        with urllib.request.urlopen(url[1] + "runs", timeout=30) as page:  # templates render
            body = page.read().decode()
        if page.status != 200 or "hello" not in body:
            raise CheckFailed(f"GET /runs answered {page.status} without the run's task")
        css = re.search(r'href="(/static/[^"]+\.css)"', body)
        if css is None:
            raise CheckFailed("the overview links no stylesheet")
        static = url[1].rstrip("/") + css[1]
        with urllib.request.urlopen(static, timeout=30) as sheet:
            if sheet.status != 200 or not sheet.read():
                raise CheckFailed(f"GET {css[1]} answered {sheet.status}")
        return f"supervisor web served /runs (the run listed) and {css[1]}"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lk-wheel-"))
    started = time.monotonic()

    def passed(what: str) -> None:
        print(f"PASS {what} ({time.monotonic() - started:.1f} s)", flush=True)

    try:
        sdist, wheel = build(work / "dist", clean_tree(work / "tree"))
        passed(f"built {sdist.name} and {wheel.name} (the wheel from the sdist)")
        check_metadata(sdist, wheel)
        passed("twine check --strict; the metadata names the version, extras and description")
        count = check_package_data(wheel)
        passed(f"the wheel holds all {count} package data files and the license")
        venv = work / "venv"
        install(wheel, venv)
        passed(f"installed {wheel.name}[{EXTRAS}] into a fresh virtual environment")
        version = check_installed(venv, work)
        passed(f"leasekeeper {version} imports from it, one version everywhere")
        pages = check_pages(venv, ["docs/tutorial.md", "README.md"])
        passed("from it, " + "; ".join(line.removeprefix("PASS ") for line in pages.splitlines()))
        passed(check_dashboard(venv, work))
    except (CheckFailed, subprocess.TimeoutExpired, ValueError) as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wheel check passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
