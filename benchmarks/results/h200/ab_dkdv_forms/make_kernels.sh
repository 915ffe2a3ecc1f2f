#!/usr/bin/env bash
# The three dK/dV kernels that the A/B runs of NOTES entry 33 (run1.sh, run2.sh) compare, written to the
# repository root, untracked, so that they travel to the device machine (run this where git is):
#   head_backward.py                the kernel of 4864065
#   loop_forms_backward.py          a scratch copy with a LOOP_FORM constexpr (0 the policy of the day, 1 three
#                                   loops, 2 one loop masking the edge tiles through a branch, 3 one loop
#                                   masking every tile, 4 the interior then one loop over the edge tiles) and
#                                   the mask written per key row
#   loop_forms_oldmask_backward.py  the same with the mask over the full tile of indices
set -euo pipefail
here=benchmarks/results/h200/ab_dkdv_forms
git show 4864065:src/flashtriton/kernels/backward.py > head_backward.py
patch -s -o loop_forms_backward.py head_backward.py "$here/loop_forms.patch"
patch -s -o loop_forms_oldmask_backward.py loop_forms_backward.py "$here/oldmask.patch"
