"""Join result files of one suite timed in parts (e.g. one head dim per GPU) into one <suite>.json, .md
and .png. Later files' rows replace earlier files' rows with the same key (provider, shape, mode).

    python benchmarks/merge_results.py --out benchmarks/results/h200 part1/paper.json part2/paper.json
"""

import argparse
import json
from pathlib import Path

from flashtriton.tools.bench import Row, merge_rows, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+", help="<suite>.json files, earliest first")
    parser.add_argument("--out", type=Path, required=True, help="folder for the joined <suite>.json, .md, .png")
    args = parser.parse_args()
    suites = {json.loads(f.read_text())["rows"][0]["suite"] for f in args.files}
    if len(suites) != 1:
        raise SystemExit(f"the files hold different suites: {sorted(suites)}")
    suite = suites.pop()
    *earlier, last = args.files
    data = json.loads(last.read_text())
    rows, meta = [Row(**r) for r in data["rows"]], data["meta"]
    for path in reversed(earlier):  # each earlier file keeps the rows that later ones do not replace
        rows = merge_rows(path, rows, meta)
    meta["unavailable"] = [u for f in args.files for u in json.loads(f.read_text())["meta"].get("unavailable", [])]
    if not meta["unavailable"]:
        del meta["unavailable"]
    write_results(args.out, suite, rows, meta)
    print(f"{len(rows)} rows -> {args.out / suite}.json, .md, .png")


if __name__ == "__main__":
    main()
