#!/usr/bin/env bash
# Call 6 of NOTES entry 39, on one H200, from the repository root: compute-sanitizer memcheck over
# benchmarks/sanitize.py (every backward now also replayed), then racecheck on its quick shape (not run
# since entry 38 changed the dK/dV kernel).
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 330 compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize.py > $OUT/sanitize_memcheck.log 2>&1
echo "memcheck exit $?"; tail -n 3 $OUT/sanitize_memcheck.log
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmarks/sanitize.py --quick > $OUT/sanitize_racecheck.log 2>&1
echo "racecheck exit $?"; tail -n 3 $OUT/sanitize_racecheck.log
