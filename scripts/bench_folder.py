"""Benchmark the CPU input paths and `prepare` on a real-photo JPEG folder → reports/input_folder.md.

    python scripts/bench_folder.py                     # 10,000 + 1,000 images, all CPU cores for prepare
    python scripts/bench_folder.py --train 100000 --val 0 --workers 16

Not a DVC stage (minutes, wall-clock numbers of one machine): run it once on an otherwise idle machine.
"""

import argparse
import json
import os
import sys
import tempfile
import time

from dpnrepro.cli import stage
from dpnrepro.errors import ParamsError
from dpnrepro.io import write_json_atomic, write_text_atomic


@stage
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=10_000, help="train images of the folder")
    ap.add_argument("--val", type=int, default=1_000, help="val images of the folder")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for writing and prepare")
    ap.add_argument("--n", type=int, default=100, help="images per input path per round")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds (>= 6 for a 95 %% CI)")
    ap.add_argument("--tmp", default=None, help="where the folder is written (default: the system temp dir)")
    ap.add_argument("--skip-prepare", action="store_true", help="leave out the prepare benchmark")
    ap.add_argument("--out-json", default="benchmarks/measured/input_folder.json")
    ap.add_argument("--out-md", default="reports/input_folder.md")
    args = ap.parse_args()
    if min(args.train, args.workers, args.n, args.rounds) < 1 or args.val < 0:
        raise ParamsError("--train, --workers, --n and --rounds must be >= 1, --val >= 0")

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from dpnrepro.benchmarks.folder import input_paths, prepare_costs, render_markdown
    from dpnrepro.benchmarks.photo_folder import write_photo_folder
    from dpnrepro.cli import hardware_label

    res = {"command": "python " + " ".join(sys.argv), "hardware": hardware_label(measured_on=True),
           "load_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="photo_folder_", dir=args.tmp) as tmp:
        t0 = time.perf_counter()
        res["folder"] = write_photo_folder(f"{tmp}/photos", args.train, args.val, workers=args.workers)
        res["folder"]["wall_s"] = time.perf_counter() - t0
        res["input"] = input_paths(f"{tmp}/photos", n=args.n, rounds=args.rounds)
        res["prepare"] = {} if args.skip_prepare else prepare_costs(f"{tmp}/photos", args.workers)
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    write_json_atomic(args.out_json, res)
    write_text_atomic(args.out_md, render_markdown(res))
    print(json.dumps({p: round(v["img_per_s_per_core"], 1) for p, v in res["input"]["paths"].items()}))
    print(f"wrote {args.out_json}, {args.out_md}")


if __name__ == "__main__":
    main()
