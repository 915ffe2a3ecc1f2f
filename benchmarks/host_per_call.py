"""Host time per call of small attention calls (the GPU keeps up, so the wall time per call is the
host's): forward without and with autograd, and forward + backward, eager and under torch.compile
(fullgraph), with autograd's backward on its CUDA device thread (the default) and on the calling thread,
for flashtriton and for SDPA as the control. Compares two trees in one run on one host (host figures
drift between runs):

    for tree in old/src src; do PYTHONPATH=$tree python benchmarks/host_per_call.py --label $tree; done
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from flashtriton import flash_attention
from host_overhead import per_call_us  # benchmarks/, the script's own folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    results = {}
    providers = {"flashtriton": lambda q, k, v: flash_attention(q, k, v, is_causal=True),
                 "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    for name, fn in providers.items():
        for way in ("eager", "compiled"):
            attend = fn if way == "eager" else torch.compile(fn, fullgraph=True, dynamic=False)

            def no_grad(attend=attend):
                with torch.no_grad():
                    attend(q, k, v)

            def fwd_bwd(attend=attend):
                attend(q, k, v).backward(do)
                q.grad = k.grad = v.grad = None
            row = dict(forward_no_grad=per_call_us(no_grad), forward=per_call_us(lambda attend=attend: attend(q, k, v)),
                       forward_backward=per_call_us(fwd_bwd))
            torch.autograd.set_multithreading_enabled(False)  # the backward on the calling thread
            row["forward_backward_calling_thread"] = per_call_us(fwd_bwd)
            torch.autograd.set_multithreading_enabled(True)
            results[f"{name} {way}"] = row
    print(json.dumps(dict(label=args.label, us=results)))


if __name__ == "__main__":
    main()
