"""The Hugging Face transformers backend (integrations/transformers.py) on tiny randomly initialised
models built from configs (nothing is downloaded): logits and gradients against transformers' own
`sdpa` (or `eager` where sdpa has no softcap), greedy `generate()` token for token, padding, packed
sequences, sliding windows, softcapping, and the errors. Skipped without the `[hf]` extra."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import DEVICE, ON_GPU  # noqa: E402
from flashtriton import flash_attention_with_kvcache  # noqa: E402
from flashtriton.integrations.transformers import NAME, attention_forward, register  # noqa: E402

VOCAB = 97


def _llama():
    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def _mistral():  # sliding-window attention on every layer
    return transformers.MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, sliding_window=6,
                                      max_position_embeddings=128)


def _gemma2():  # softcapped scores, a query_pre_attn_scalar scale, sliding and full layers alternating
    return transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
                                     attn_logit_softcapping=20.0, final_logit_softcapping=30.0,
                                     query_pre_attn_scalar=24, max_position_embeddings=128)


MODELS = {"llama": (_llama, "sdpa"), "mistral": (_mistral, "sdpa"), "gemma2": (_gemma2, "eager")}


def _model(config, implementation, dtype=torch.float32):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation, dtype=dtype)
    return model.to(DEVICE).eval()


def _batch(batch=2, seqlen=13):
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, seqlen), device=DEVICE)
    mask = torch.ones(batch, seqlen, dtype=torch.long, device=DEVICE)
    mask[1, :4] = 0  # left padding, as generation lays out a batch
    return ids, mask


def test_registered_name():
    assert register() == NAME == "FlashTriton"
    assert NAME in transformers.AttentionInterface().valid_keys()
    with pytest.raises(ValueError, match="containing 'flash'"):
        register("flashtriton")


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_gradients_match(name):
    make_config, reference = MODELS[name]
    ids, mask = _batch()
    # Padded positions out of the loss, as in training, and so is each row's first token: the position
    # before it, padding, predicts it, and a padded query's output is arbitrary (0 here).
    labels = ids.masked_fill(mask == 0, -100)
    labels[1, 4] = -100
    results = {}
    for implementation in (reference, NAME):
        model = _model(make_config(), implementation)
        out = model(ids, attention_mask=mask, labels=labels)
        grads = torch.autograd.grad(out.loss, list(model.parameters()))
        results[implementation] = out.logits, grads
    (logits, grads), (ref_logits, ref_grads) = results[NAME], results[reference]
    kept = mask.bool()  # padded positions' logits are arbitrary in both
    torch.testing.assert_close(logits[kept], ref_logits[kept], atol=2e-5, rtol=2e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=2e-4)


def _generated(name: str, padded: bool, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens of a greedy generate() of 6 tokens after a 20-token prompt (left-padded or not), through
    our backend and through the model's reference implementation, the same weights in both."""
    make_config, reference = MODELS[name]
    ids, mask = _batch(seqlen=20)
    if not padded:
        mask = torch.ones_like(mask)
    tokens = {}
    for implementation in (NAME, reference):
        model = _model(make_config(), implementation)
        tokens[implementation] = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                                pad_token_id=0, **options)
    return tokens[NAME], tokens[reference]


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
@pytest.mark.parametrize("name", list(MODELS))
def test_generate_same_tokens(name, padded, monkeypatch):
    """Greedy generation gives sdpa's (or eager's) tokens; every decoding step after the prompt runs
    through the KV-cache kernel, with the left padding as cache_leftpad while the padded keys are in the
    cache (a sliding-window layer's cache drops them). The prompt (20 tokens) takes the prefill path."""
    from flashtriton.integrations import transformers as backend
    decode_calls, pads = [], []

    def counted(*args, **kwargs):
        decode_calls.append(kwargs.get("cache_leftpad") is not None)
        pads.append(kwargs.get("cache_leftpad"))
        return flash_attention_with_kvcache(*args, **kwargs)
    monkeypatch.setattr(backend, "flash_attention_with_kvcache", counted)
    ours, reference = _generated(name, padded)
    assert torch.equal(ours, reference)
    layers = MODELS[name][0]().num_hidden_layers
    assert len(decode_calls) == 5 * layers  # 6 new tokens: the prompt's pass, then 5 decoding steps
    # Mistral's sliding-window cache keeps the last 6 keys, past the padding: transformers passes no mask.
    assert any(decode_calls) == (padded and name != "mistral")
    if padded and name == "llama":
        # The layers of a step share their mask's left padding (one tensor per step), so that it and its
        # checks are read back to the host once per step, not once per layer.
        assert len(pads) == 5 * layers and len({id(p) for p in pads}) == 5


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
@pytest.mark.parametrize("name", list(MODELS))
def test_generate_static_cache(name, padded):
    """A static cache hands every layer its whole preallocated length, whose slots past the newest token
    are not written yet: with a mask it covers only the tokens seen, without one the position ids count
    them. Greedy generation still gives the reference's tokens (before, the empty slots were attended)."""
    ours, reference = _generated(name, padded, cache_implementation="static")
    assert torch.equal(ours, reference)


def test_kept_run_read_once_per_mask():
    """Each row's kept keys [first, end) as cache_leftpad and length (None: all Nk keys): read back once per
    (mask, position ids) while both live unmodified; end from the position ids, so that a static cache's
    mask, padded with its unwritten slots, reads right; a mask with a hole is no run (the packed path
    takes it)."""
    from flashtriton.integrations.transformers import _kept_run
    key = torch.randn(2, 2, 5, 16, device=DEVICE)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)
    positions = torch.tensor([[2], [4]], device=DEVICE)  # the last query's position: its row's kept tokens - 1
    first, end = _kept_run(mask, positions, 1, key)
    assert first.tolist() == [2, 0] and end is None  # every run ends at Nk: the call's int length
    assert _kept_run(mask, positions, 1, key)[0] is first  # remembered for these very tensors
    assert _kept_run(mask, None, 1, key)[1] is None  # no position ids: every key up to Nk
    mask[1, 0] = False  # modified in place: read again
    assert _kept_run(mask, torch.tensor([[2], [3]], device=DEVICE), 1, key)[0].tolist() == [2, 1]
    static = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool, device=DEVICE)  # 3 slots written
    first, end = _kept_run(static, torch.tensor([[1], [2]], device=DEVICE), 1, key)
    assert first.tolist() == [1, 0] and end.tolist() == [3, 3]
    assert _kept_run(static, None, 1, key) is None  # without position ids the unwritten slots read as padding
    hole = torch.tensor([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)
    assert _kept_run(hole, torch.tensor([[3], [4]], device=DEVICE), 1, key) is None


def test_kept_run_under_compile():
    """Traced by torch.compile (fullgraph: no branch on the values), the run comes from the position ids
    and its check is an assertion that fails on a mask with a hole; without position ids there is no run
    (the packed path then takes the call)."""
    from flashtriton.integrations.transformers import _kept_run
    key = torch.randn(2, 2, 5, 16, device=DEVICE)
    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool, device=DEVICE)  # 3 slots written
    positions = torch.tensor([[1], [2]], device=DEVICE)
    torch._dynamo.reset()
    run = torch.compile(lambda m, p: _kept_run(m, p, 1, key), backend="eager", fullgraph=True)
    first, end = run(mask, positions)
    assert first.tolist() == [1, 0] and end.tolist() == [3, 3]
    assert torch.compile(lambda m: _kept_run(m, None, 1, key), backend="eager", fullgraph=True)(mask) is None
    if not ON_GPU:  # on a GPU the assertion is a device-side assert, which ends the process's CUDA context
        hole = torch.tensor([[1, 0, 1, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
        with pytest.raises(RuntimeError, match="one run"):
            run(hole, torch.tensor([[1], [2]]))
    torch._dynamo.reset()


@pytest.mark.parametrize("static", [True, False], ids=["static-cache", "dynamic-cache"])
def test_a_decoding_step_with_dropout_attends_the_written_keys(static):
    """A decoding-size call without gradients but with dropout (a model left in training mode) cannot take
    the KV-cache kernel: the packed path gets the keys written so far, whether the mask spans a static
    cache's unwritten slots (NaN here: attending one would show) or ends at Nk; the same draws as the
    call on those keys alone."""
    torch.manual_seed(3)
    query = torch.randn(2, 4, 2, 16, device=DEVICE)
    key, value = (torch.randn(2, 2, 12, 16, device=DEVICE) for _ in range(2))
    seen = 9 if static else 12
    key[:, :, seen:], value[:, :, seen:] = float("nan"), float("nan")
    mask = torch.zeros(2, 12, dtype=torch.bool, device=DEVICE)
    mask[0, 2:seen], mask[1, :seen] = True, True
    positions = mask[:, :seen].long().cumsum(-1)[:, -2:] - 1
    module = torch.nn.Module()

    def call(mask, key, value):
        torch.manual_seed(7)
        return attention_forward(module, query, key, value, mask, dropout=0.5, position_ids=positions)[0]
    with torch.no_grad():
        out = call(mask, key, value)
        alone = call(mask[:, :seen], key[:, :, :seen], value[:, :, :seen])
    assert torch.isfinite(out).all() and torch.equal(out, alone)


def test_padding_mask_pads_a_static_cache_for_decoding():
    """The mask builder: transformers' flash one (sliced from the right, None when nothing is padded), except
    that a decoding step's mask against a static cache (shorter than the cache) is padded to the cache's
    length, one shape for every step, while a prefill's (more than DECODE_QUERIES queries) is not."""
    from flashtriton.integrations.transformers import DECODE_QUERIES, padding_mask
    seen = torch.tensor([[0, 1, 1], [1, 1, 1]], dtype=torch.bool, device=DEVICE)
    with torch.no_grad():
        padded = padding_mask(2, 1, 8, attention_mask=seen)
        assert padded.shape == (2, 8) and torch.equal(padded[:, :3], seen) and not padded[:, 3:].any()
        assert torch.equal(padding_mask(2, DECODE_QUERIES + 1, 8, attention_mask=seen), seen)
        assert padding_mask(2, 1, 3, attention_mask=torch.ones_like(seen)) is None
        window = torch.tensor([[1, 0, 1], [1, 1, 1]], dtype=torch.bool, device=DEVICE)
        assert torch.equal(padding_mask(2, 1, 2, attention_mask=window), window[:, 1:])  # a sliding window's last keys
    assert torch.equal(padding_mask(2, 1, 8, attention_mask=seen), seen)  # with gradients: as the flash builder
    assert padding_mask(2, 1, 8) is None


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
@pytest.mark.parametrize("name", list(MODELS))
def test_generate_compiled_static_cache(name, padded):
    """generate() with a static cache compiles its decoding step (transformers' auto-compile); through our
    backend that step is one graph (fullgraph=True), compiled no more often than with the reference
    implementation under the same config (once or twice for Llama's five steps: some transformers versions
    pass the first step one keyword more; a sliding-window cache recompiles every step whatever the
    backend), not once per length, and it gives the reference's tokens."""
    make_config, reference = MODELS[name]
    ids, mask = _batch(seqlen=20)
    ids = ids.clamp(min=1) * (mask if padded else 1)  # no pad token inside the unpadded prompt
    mask = mask if padded else torch.ones_like(mask)
    config = transformers.CompileConfig(fullgraph=True, dynamic=False, backend="inductor" if ON_GPU else "aot_eager")
    config._compile_all_devices = True  # transformers compiles on accelerators only by default
    tokens, graphs = {}, {}
    counters = torch._dynamo.utils.counters
    # A sliding-window cache compiles each step anew, some 2.5 s apiece on CPU: two decoding steps show it.
    new_tokens = 6 if name == "llama" else 3
    for implementation in (NAME, reference):
        torch._dynamo.reset()
        counters.clear()
        model = _model(make_config(), implementation)
        tokens[implementation] = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                                pad_token_id=0, cache_implementation="static", compile_config=config)
        graphs[implementation] = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    # Llama: at most 2 whatever the reference needs (on the H200, transformers 5.17 hands our backend's first
    # decoding step a mask and the later ones none, unpadded: guard len(kwargs) == 7 fails once).
    assert 1 <= graphs[NAME] <= (max(graphs[reference], 2) if name == "llama" else graphs[reference]), graphs
    assert torch.equal(tokens[NAME], tokens[reference])


def test_packed_sequences():
    """One row holding three sequences, described by cu_seq_lens keywords (DataCollatorWithFlattening) or
    only by restarting position_ids: each sequence attends to itself alone."""
    model = _model(_llama(), NAME)
    torch.manual_seed(2)
    lengths = [5, 9, 3]
    seqs = [torch.randint(0, VOCAB, (1, n), device=DEVICE) for n in lengths]
    separate = torch.cat([model(s).logits for s in seqs], dim=1)
    ids = torch.cat(seqs, dim=1)
    positions = torch.cat([torch.arange(n, device=DEVICE) for n in lengths])[None]
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32, device=DEVICE)
    with_keywords = model(ids, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9,
                          max_length_k=9).logits
    from_positions = model(ids, position_ids=positions).logits
    torch.testing.assert_close(with_keywords, separate, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_positions, separate, atol=1e-5, rtol=1e-5)


class _Module(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(s_aux=torch.zeros(4)), NotImplementedError, "attention sinks"),
    (dict(attention_mask=torch.ones(1, 1, 7, 7, dtype=torch.bool)), NotImplementedError, "2-D padding mask"),
    (dict(value=torch.randn(1, 2, 7, 8)), NotImplementedError, "value head dim 8"),
])
def test_unsupported_calls_are_clear_errors(kwargs, error, match):
    args = dict(query=torch.randn(1, 4, 7, 16), key=torch.randn(1, 2, 7, 16), value=torch.randn(1, 2, 7, 16),
                attention_mask=None)
    args.update(kwargs)
    args = {key: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for key, value in args.items()}
    with pytest.raises(error, match=match):
        attention_forward(_Module(), **args)


@pytest.mark.skipif(not ON_GPU, reason="bf16 and Inductor on the GPU")
@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_and_a_compiled_training_step(name):
    make_config, reference = MODELS[name]
    ids, mask = _batch(4, 64)
    results = {}
    for implementation in (reference, NAME):
        model = _model(make_config(), implementation, torch.bfloat16)
        results[implementation] = model(ids, attention_mask=mask).logits.float()
    kept = mask.bool()
    # bf16 end to end: both differ from float32 by ~1e-2 here; bound ours by 2x the reference's own error
    exact = _model(make_config(), reference, torch.float32)(ids, attention_mask=mask).logits
    err = (results[NAME] - exact)[kept].abs().max()
    ref_err = (results[reference] - exact)[kept].abs().max()
    assert err <= 2 * ref_err + 1e-3, (err, ref_err)

    torch._dynamo.reset()
    model = _model(make_config(), NAME, torch.bfloat16).train()
    # No mask: a mask of ones is checked for padding on the host by transformers' mask builder (a graph break).
    step = torch.compile(lambda ids: model(ids, labels=ids).loss, fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        loss = step(ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    torch._dynamo.reset()
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


def test_written_keys_from_position_ids():
    """Without a padding mask the newest position id + 1 counts a sequence's written keys (a static cache's
    later slots are empty), clamped to the cache; position ids of another shape (multimodal rotary
    embeddings pass (3, B, N)) or none leave every key in."""
    from flashtriton.integrations.transformers import _written_keys
    key = torch.randn(2, 2, 12, 16, device=DEVICE)
    positions = torch.arange(4, 7, device=DEVICE)[None]  # (1, Nq): one row for the whole batch
    assert _written_keys(positions, key).tolist() == [7, 7]
    assert _written_keys(torch.tensor([[20], [3]], device=DEVICE), key).tolist() == [12, 4]
    assert _written_keys(torch.zeros(3, 2, 5, dtype=torch.long, device=DEVICE), key) == 12
    assert _written_keys(None, key) == 12
