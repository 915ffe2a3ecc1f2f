"""Greedy `generate()` through transformers with attn_implementation="FlashTriton" (whose decoding steps
take the KV-cache kernel) against "sdpa", on randomly initialised Llama models (nothing is downloaded),
bf16: a tiny one and one of Llama 3.2 1B's shape. Reports wall time per new token, the decoding steps'
own time (prefill taken out), and checks that both produce the same tokens.

`--cache static` generates with transformers' static cache, which makes generate() compile the decoding
step (torch.compile, inductor, mode "reduce-overhead": CUDA graphs) for both implementations; the
compile config asks for static shapes (one compile per case). The prefill runs eagerly in both modes.

Timing: each (model, batch, prompt) runs both implementations in ROUNDS interleaved rounds, one
`generate()` of NEW_TOKENS tokens each (min_new_tokens = max_new_tokens: no early stop), after one warm-up
generate; the median round is kept. Prefill is in the time per new token. Each round also times a
generate() of one token (the prefill and its token): (time of NEW_TOKENS - time of 1) / (NEW_TOKENS - 1)
is the time per decoding step.

    PYTHONPATH=src python benchmarks/generate.py [--out DIR] [--models tiny] [--cases 0,3] [--cache static]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import transformers

from flashtriton.integrations.transformers import NAME
from flashtriton.tools.bench import environment

ROUNDS = 3
NEW_TOKENS = 64
MODELS = {
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=32000),
    "1B-shape": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, vocab_size=128256),
}
# (batch, prompt tokens, left-padded): a padded batch's rows start after 0 to prompt / 2 pad tokens
CASES = [(1, 128, False), (8, 2048, False), (32, 4096, False), (8, 2048, True)]


def _model(name: str, implementation: str):
    config = transformers.LlamaConfig(max_position_embeddings=8192, **MODELS[name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation,
                                                          dtype=torch.bfloat16)
    return model.to("cuda").eval()


def _prompt(batch: int, prompt: int, padded: bool, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids (B, prompt) and their attention mask, 0 on each row's left padding."""
    ids = torch.randint(1, vocab, (batch, prompt), device="cuda")
    mask = torch.ones_like(ids)
    if padded:
        pads = torch.randint(0, prompt // 2, (batch,), device="cuda")
        mask = (torch.arange(prompt, device="cuda")[None, :] >= pads[:, None]).long()
        ids = ids * mask  # pad token 0
    return ids, mask


def _generate(model, ids, mask, cache: str, tokens: int = NEW_TOKENS):
    options = {}
    if cache == "static":
        options = dict(cache_implementation="static", compile_config=transformers.CompileConfig(dynamic=False))
    return model.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                          pad_token_id=0, **options)


def _timed(model, ids, mask, cache: str, tokens: int) -> float:
    """Wall time of one generate() of `tokens` new tokens, ms."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    _generate(model, ids, mask, cache, tokens)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--cases", default=",".join(map(str, range(len(CASES)))), help="indices into CASES")
    parser.add_argument("--cache", choices=("dynamic", "static"), default="dynamic",
                        help="static: transformers' static cache, whose decoding steps generate() compiles")
    args = parser.parse_args()
    rows, meta = [], environment()
    for name in args.models.split(","):
        models = {impl: _model(name, impl) for impl in (NAME, "sdpa")}
        models[NAME].load_state_dict(models["sdpa"].state_dict())
        for batch, prompt, padded in (CASES[int(i)] for i in args.cases.split(",")):
            torch.manual_seed(batch + prompt)
            torch._dynamo.reset()  # every model shares the compiled frames: a fresh recompile budget per case
            ids, mask = _prompt(batch, prompt, padded, MODELS[name]["vocab_size"])
            times = {impl: [] for impl in models}
            steps = {impl: [] for impl in models}
            tokens = {}
            with torch.no_grad():
                for impl, model in models.items():
                    # warm-up: compiles, autotunes, records launches (and CUDA graphs with a static cache)
                    tokens[impl] = _generate(model, ids, mask, args.cache)
                    _generate(model, ids, mask, args.cache, 1)
                for _ in range(ROUNDS):
                    for impl, model in models.items():
                        whole = _timed(model, ids, mask, args.cache, NEW_TOKENS)
                        prefill = _timed(model, ids, mask, args.cache, 1)
                        times[impl].append(whole / NEW_TOKENS)
                        steps[impl].append((whole - prefill) / (NEW_TOKENS - 1))
            same = (tokens[NAME] == tokens["sdpa"]).float().mean().item()
            row = dict(model=name, batch=batch, prompt=prompt, left_padded=padded, cache=args.cache,
                       new_tokens=NEW_TOKENS, ms_per_token={impl: statistics.median(t) for impl, t in times.items()},
                       ms_per_decode_step={impl: statistics.median(t) for impl, t in steps.items()},
                       same_tokens=same)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out is not None:  # after every row: a run cut short keeps what it finished
                args.out.mkdir(parents=True, exist_ok=True)
                result = dict(meta=meta, rounds=ROUNDS, rows=rows)
                name = "generate.json" if args.cache == "dynamic" else "generate_static.json"
                (args.out / name).write_text(json.dumps(result, indent=1))
        del models
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
