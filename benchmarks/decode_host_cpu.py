"""The host cost of a decoding step through the transformers backend, on any machine: the same calls as
generate() makes (four layers per step, a new cache tensor every step as DynamicCache makes, position
ids), with the replayed decode launch replaced by a no-op, so what is timed is our Python from
transformers' call to Triton's launcher (each plan's first call still runs its kernel through the
interpreter; the fastest of the rounds leaves it out). Beside it, transformers' SDPA attention function
on the same tensors (computing on the CPU). Runs through Triton's interpreter mode on CPU tensors; the
CPU's speed drifts, so compare the ratio between commits, not the microseconds (the GPU host's figures:
benchmarks/generate.py).

    PYTHONPATH=src python benchmarks/decode_host_cpu.py [--profile]
"""

import argparse
import os
import time

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

import flashtriton.launch.decode as decode_launcher  # noqa: E402
from flashtriton.integrations.transformers import attention_forward  # noqa: E402

BATCH, HEADS_Q, HEADS_KV, HEAD_DIM, LAYERS, PROMPT, STEPS, ROUNDS = 1, 8, 2, 32, 4, 128, 64, 12


class _Layer(torch.nn.Module):
    is_causal = True
    num_key_value_groups = HEADS_Q // HEADS_KV


def _steps(attention):
    """A function running STEPS decoding steps of LAYERS calls each, and its call count."""
    keys = [torch.randn(BATCH, HEADS_KV, PROMPT + i, HEAD_DIM, dtype=torch.bfloat16) for i in range(STEPS)]
    values = [torch.randn_like(k) for k in keys]
    query = torch.randn(BATCH, 1, HEADS_Q, HEAD_DIM, dtype=torch.bfloat16).transpose(1, 2)  # as projected
    layer = _Layer()

    def run():
        for i in range(STEPS):
            positions = torch.full((BATCH, 1), PROMPT + i - 1)
            for _ in range(LAYERS):
                attention(layer, query, keys[i], values[i], None, scaling=HEAD_DIM ** -0.5, position_ids=positions)
    return run, STEPS * LAYERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of ours")
    args = parser.parse_args()
    # The launch stubbed: a recorded plan "replays" without launching anything.
    decode_launcher.replay.replayable = lambda device: True
    decode_launcher.replay.current_device_and_stream = lambda: (0, 0)
    decode_launcher.replay.Recorded.replay = lambda self, prefix, stream, scalars=None, grid=None: None
    runs = {"flashtriton": _steps(attention_forward), "sdpa": _steps(sdpa_attention_forward)}
    best = dict.fromkeys(runs, float("inf"))
    with torch.no_grad():
        for _ in range(ROUNDS):  # interleaved; the fastest round of each
            for name, (run, calls) in runs.items():
                start = time.perf_counter()
                run()
                best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    print(f"µs per attention call: flashtriton {best['flashtriton']:.1f}, sdpa {best['sdpa']:.1f} "
          f"(computing on this CPU), ratio {best['flashtriton'] / best['sdpa']:.2f}")
    if args.profile:
        import cProfile
        import pstats
        run = runs["flashtriton"][0]
        with torch.no_grad(), cProfile.Profile() as profile:
            run()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
