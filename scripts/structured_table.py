"""Write quax-structured's generated support table into its README.

The table (decompositions and matrix functions by structure) is produced by
running the rules on small examples (`quax_structured._table.support_table`);
this script replaces the README's text between the table's two markers with it.
`quax-structured/tests/test_support_table.py` checks that the README holds the
generated table, so run this after changing a rule:

    python scripts/structured_table.py          # rewrite the README's table
    python scripts/structured_table.py --check  # exit 1 if the README differs
"""

import argparse
import sys
from pathlib import Path

from quax_structured._table import BEGIN, END, support_table


README = Path(__file__).parents[1] / "quax-structured" / "README.md"


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Write quax-structured's generated support table into its README."
    )
    parser.add_argument(
        "--check", action="store_true", help="only check, exit 1 if it differs"
    )
    args = parser.parse_args()
    text = README.read_text()
    if BEGIN not in text or END not in text:
        print(f"{README}: the table's markers are missing ({BEGIN!r} ... {END!r})")
        return 1
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    new = f"{before}{BEGIN}\n{support_table()}\n{END}{after}"
    if args.check:
        if new != text:
            print(f"{README}: the support table is out of date; run this script.")
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
