"""The predictions behind the RULER export fixture: per length, per task, (prediction, references) in sample order.
Shared by `make.py` (which scores them with upstream's evaluate.py) and tests/test_export_interop.py (which makes
a longctx run of them and exports it). They hold what CSV quoting and RULER's post-processing must get right:
commas, quotes, newlines and other control characters, empty predictions, non-ASCII text."""

SAMPLES = {
    4096: {
        "vt": [("VAR AAA, VAR BBB", ["AAA", "BBB"]), ("VAR CCC", ["CCC", "DDD"]), ("", ["EEE"])],
        "qa_1": [('He said "Paris", then left.', ["Paris", "London"]), ("\x01 Münster\tand more \n", ["Berlin"]),
                 ("Lyon", ["lyon"])],
        "niah_single_1": [("The number is 1234567.", ["1234567"]), ("   ", ["7654321"]),
                          ("line one\nline two 42", ["42"])],
    },
    8192: {"vt": [("VAR XYZ", ["XYZ"]), ("nothing, here", ["QQQ"])]},
}
# the order a user asked for (`--tasks`): upstream writes synthetic.yaml's order whatever it is
ASKED = ["vt", "qa_1", "niah_single_1"]
