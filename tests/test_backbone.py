import pytest
import torch
import torch.nn.functional as F

from unimodal.backbone import PRESETS, ConditionCache, DiT, flops_per_token
from unimodal.backbone.dit import attention_visibility
from unimodal.tokenizers_mm.layout import MASK, SEG_AUDIO, SEG_IMAGE, SEG_PAD, SEG_TEXT
from unimodal.core.errors import InputError

VOCAB = 40


def randomized(model: DiT, seed: int = 0) -> DiT:
    """Random weights everywhere: at init adaLN-Zero makes every block the identity, which hides the attention
    pattern and the t conditioning from the tests below."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model.eval()


@pytest.fixture
def model():
    torch.manual_seed(0)
    return randomized(DiT.from_preset("tiny", vocab_size=VOCAB))


def text_positions(batch: int, length: int, start: int = 0) -> torch.Tensor:
    steps = torch.arange(start, start + length)
    return torch.stack([steps, steps], dim=-1).expand(batch, length, 2).clone()  # (B, L, 2)


def sample_inputs(batch=2, length=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=generator)
    segment_ids = torch.full((batch, length), SEG_TEXT)
    segment_ids[:, length // 2:] = SEG_AUDIO
    is_target = torch.zeros(batch, length, dtype=torch.bool)
    is_target[:, length // 2:] = True
    t = torch.rand(batch, generator=generator)
    return dict(ids=ids, t=t, segment_ids=segment_ids, positions=text_positions(batch, length),
                is_target=is_target)


def test_output_shapes_and_dtypes(model):
    out = model(**sample_inputs(batch=3, length=10))
    assert out.logits.shape == (3, 10, VOCAB) and out.logits.dtype == torch.float32
    assert out.critic.shape == (3, 10) and out.critic.dtype == torch.float32
    assert out.hidden.shape == (3, 10, PRESETS["tiny"]["hidden_size"])


def test_adaln_zero_blocks_start_as_identity():
    model = DiT.from_preset("tiny", vocab_size=VOCAB).eval()
    inputs = sample_inputs()
    x = torch.randn(2, 12, model.config.hidden_size)
    c_pair = model.condition_pair(inputs["t"])
    rope = model.rotary(inputs["positions"])
    visible = attention_visibility(inputs["is_target"], torch.ones(2, 12, dtype=torch.bool))
    for block in model.blocks:
        out, _ = block(x, c_pair, inputs["is_target"], rope, visible)
        assert torch.equal(out, x)
    assert torch.equal(model(**inputs).critic, torch.zeros(2, 12))  # critic starts undecided


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adaln_rows_by_product_equal_torch_where_exactly_with_gradients(dtype):
    from unimodal.backbone.dit import per_token, per_token_where

    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 2, 12, generator=generator).to(dtype)
    is_target = torch.rand(3, 7, generator=generator) > 0.5
    is_target[0] = True  # a sequence of targets only, and one of conditions only
    is_target[1] = False
    grad = torch.randn(3, 7, 12, generator=generator).to(dtype)
    outputs, grads = [], []
    for choose in (per_token, per_token_where):
        leaf = rows.clone().requires_grad_(True)
        out = choose(leaf, is_target)
        out.backward(grad)
        outputs.append(out.detach())
        grads.append(leaf.grad)
    assert outputs[0].dtype == dtype and torch.equal(outputs[0], outputs[1])  # bit for bit
    assert torch.allclose(grads[0].float(), grads[1].float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as training runs on a CPU with bf16 units
        assert torch.equal(per_token(rows.float().bfloat16(), is_target), per_token_where(rows.bfloat16(), is_target))


def padded_inputs(seed=0):
    """Three sequences of 12, 7 and 4 real tokens padded to 12: the shape of a mixed training batch."""
    inputs = sample_inputs(batch=3, length=12, seed=seed)
    real = torch.arange(12)[None] < torch.tensor([[12], [7], [4]])  # (3, 12)
    inputs["ids"] = inputs["ids"].masked_fill(~real, 0)
    inputs["segment_ids"] = inputs["segment_ids"].masked_fill(~real, SEG_PAD)
    inputs["is_target"] = inputs["is_target"] & real
    inputs["is_target"][1, 3:7] = True  # targets inside the shorter sequences too
    inputs["is_target"][2, 2:4] = True
    return inputs, real


@pytest.mark.parametrize("causal", [False, True])
def test_unpadded_forward_gives_the_padded_forwards_values_and_gradients(causal):
    from unimodal.backbone.dit import Packing

    torch.manual_seed(0)
    model = randomized(DiT.from_preset("tiny", vocab_size=VOCAB, causal=causal)).train()
    inputs, real = padded_inputs()
    outputs, grads = [], []
    for unpad in (False, True):
        model.zero_grad()
        out = model(**inputs, attention_mask=real, unpad=unpad)
        (out.logits[real].square().mean() + out.critic[real].square().mean()).backward()
        outputs.append(out)
        grads.append([p.grad.clone() for p in model.parameters()])
    padded, packed = outputs
    for name in ("logits", "critic", "hidden"):
        assert torch.allclose(getattr(padded, name)[real], getattr(packed, name)[real], atol=1e-5), name
        assert torch.equal(getattr(packed, name)[~real], torch.zeros_like(getattr(packed, name)[~real])), name
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5)
    packing = Packing.of(real, inputs["is_target"])
    assert packing.index.tolist() == real.flatten().nonzero().squeeze(1).tolist()  # 12 + 7 + 4 real tokens
    sample = torch.arange(3)[:, None].expand(3, 12)[real]
    assert torch.equal(packing.rows, 2 * sample + inputs["is_target"][real].long())  # each token's adaLN row
    x = torch.randn(3, 12, 5)
    assert torch.equal(packing.unpack(packing.pack(x)), x * real[..., None])  # padding comes back as zeros


def test_copies_share_their_conditions_and_give_the_padded_forwards_values():
    torch.manual_seed(0)
    model = randomized(DiT.from_preset("tiny", vocab_size=VOCAB)).train()
    inputs, real = padded_inputs()
    twice = {k: torch.cat([v, v]) for k, v in inputs.items()}
    twice["t"] = torch.rand(6, generator=torch.Generator().manual_seed(1))  # each copy its own t ...
    is_target = twice["is_target"]
    second = torch.zeros_like(is_target)
    second[3:] = is_target[3:]
    twice["ids"] = twice["ids"].masked_fill(second, MASK)  # ... and its own targets (a complementary mask)
    mask = torch.cat([real, real])
    outputs, grads = [], []
    for unpad, copies in ((False, 1), (True, 2)):
        model.zero_grad()
        out = model(**twice, attention_mask=mask, unpad=unpad, copies=copies)
        (out.logits[mask].square().mean() + out.hidden[mask].square().mean()).backward()
        outputs.append(out)
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for name in ("logits", "critic", "hidden"):
        assert torch.allclose(getattr(outputs[0], name)[mask], getattr(outputs[1], name)[mask], atol=1e-5), name
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*grads)) and len(grads[0]) == len(grads[1])
    from unimodal.backbone.dit import Packing

    packing = Packing.of(mask, is_target, copies=2)
    conditions = real & ~inputs["is_target"]
    assert len(packing.index) == int(real.sum()) + int(inputs["is_target"].sum())  # second copy: targets only
    x = torch.randn(6, 12, 4)
    shown = packing.unpack(packing.pack(x))
    assert torch.equal(shown[3:][conditions], x[:3][conditions])  # the first copy's conditions in the second
    bad = dict(twice, ids=twice["ids"].clone())
    bad["ids"][4, 0] = (bad["ids"][4, 0] + 1) % VOCAB  # a condition token differs between the copies
    with pytest.raises(InputError, match="condition ids"):
        model(**bad, attention_mask=mask, unpad=True, copies=2)
    with pytest.raises(InputError, match="copies"):
        model(**twice, attention_mask=mask, unpad=True, copies=4)
    # sharing would not be exact for a causal model (a condition may see targets) or under dropout (each copy
    # draws anew): those compute every copy, and still give the padded forward's values
    built = []
    real_of = Packing.of.__func__
    for causal, dropout in ((True, 0.0), (False, 0.3)):
        other = randomized(DiT.from_preset("tiny", vocab_size=VOCAB, causal=causal, dropout=dropout)).train()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Packing, "of", classmethod(lambda cls, *a: built.append(a[2]) or real_of(cls, *a)))
            other(**twice, attention_mask=mask, unpad=True, copies=2)
        if causal:
            other.eval()
            torch.testing.assert_close(other(**twice, attention_mask=mask, unpad=True, copies=2).logits[mask],
                                       other(**twice, attention_mask=mask).logits[mask], atol=1e-5, rtol=0)
    assert built == [1, 1]


def test_unpad_leaves_a_batch_without_padding_on_the_padded_path(model, monkeypatch):
    from unimodal.backbone import dit

    built = []
    monkeypatch.setattr(dit.Packing, "of", classmethod(lambda cls, *a: built.append(a)))
    inputs = sample_inputs(batch=2, length=10)
    out = model(**inputs, unpad=True)
    assert not built and torch.equal(out.logits, model(**inputs).logits)


def test_attention_visibility_pattern():
    is_target = torch.tensor([[False, False, True, True, False]])
    real = torch.tensor([[True, True, True, True, False]])
    visible = attention_visibility(is_target, real)[0, 0]
    expected = torch.tensor([[1, 1, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 0],
                             [1, 1, 0, 0, 1]], dtype=torch.bool)  # padding query: conditions and itself
    assert torch.equal(visible, expected)


def test_perturbing_a_target_never_changes_conditions(model):
    inputs = sample_inputs()
    before = model(**inputs)
    perturbed = dict(inputs, ids=inputs["ids"].clone())
    perturbed["ids"][:, -1] = (perturbed["ids"][:, -1] + 1) % VOCAB  # change the last target token
    after = model(**perturbed)
    cond = ~inputs["is_target"]
    assert torch.equal(before.hidden[cond], after.hidden[cond])
    assert torch.equal(before.logits[cond], after.logits[cond])
    other_targets = inputs["is_target"].clone()
    other_targets[:, -1] = False
    assert not torch.allclose(before.logits[other_targets], after.logits[other_targets], atol=1e-4)


def test_conditions_do_not_depend_on_t_but_targets_do(model):
    inputs = sample_inputs()
    low = model(**dict(inputs, t=torch.tensor([0.1, 0.2])))
    high = model(**dict(inputs, t=torch.tensor([0.9, 0.7])))
    cond, target = ~inputs["is_target"], inputs["is_target"]
    assert torch.equal(low.logits[cond], high.logits[cond])
    assert not torch.allclose(low.logits[target], high.logits[target], atol=1e-4)


def ragged_condition_batch():
    """Three samples: conditions of 5, 2 and 0 tokens (padded to 5), targets of 4, 6 and 3 (padded to 6)."""
    generator = torch.Generator().manual_seed(1)
    cond_lens, target_lens = [5, 2, 0], [4, 6, 3]
    samples = []
    for cond_len, target_len in zip(cond_lens, target_lens):
        cond = torch.randint(0, VOCAB, (cond_len,), generator=generator)
        target = torch.randint(0, VOCAB, (target_len,), generator=generator)
        target[::2] = MASK
        samples.append((cond, target))
    return samples


def pad_rows(rows, length, value):
    out = torch.full((len(rows), length, *rows[0].shape[1:]), value, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def split_batch(samples):
    """Padded condition part and padded target part; conditions are text, targets an image-like 2-D grid."""
    conds, targets = zip(*samples)
    cond_len, target_len = max(len(c) for c in conds), max(len(t) for t in targets)
    cond_pos = [text_positions(1, len(c))[0] for c in conds]
    target_pos = [torch.stack([torch.arange(len(t)) // 2 + 1, torch.arange(len(t)) % 2 + 1], -1) for t in targets]
    cond = dict(ids=pad_rows(conds, cond_len, 0),
                segment_ids=pad_rows([torch.full((len(c),), SEG_TEXT) for c in conds], cond_len, SEG_PAD),
                positions=pad_rows(cond_pos, cond_len, 0),
                attention_mask=pad_rows([torch.ones(len(c), dtype=torch.bool) for c in conds], cond_len, False))
    target = dict(ids=pad_rows(targets, target_len, 0),
                  segment_ids=pad_rows([torch.full((len(t),), SEG_IMAGE) for t in targets], target_len, SEG_PAD),
                  positions=pad_rows(target_pos, target_len, 0),
                  attention_mask=pad_rows([torch.ones(len(t), dtype=torch.bool) for t in targets], target_len,
                                          False))
    return cond, target


def full_forward_of_sample(model, cond, target, b, t):
    """The uncached model on one sample, unpadded: conditions then targets in one sequence."""
    n_cond, n_target = int(cond["attention_mask"][b].sum()), int(target["attention_mask"][b].sum())
    join = lambda key: torch.cat([cond[key][b, :n_cond], target[key][b, :n_target]])[None]  # noqa: E731
    is_target = torch.cat([torch.zeros(n_cond, dtype=torch.bool), torch.ones(n_target, dtype=torch.bool)])[None]
    out = model(join("ids"), t[b:b + 1], join("segment_ids"), join("positions"), is_target)
    return out.logits[0, n_cond:]


def test_condition_cache_equals_full_forward(model):
    cond, target = split_batch(ragged_condition_batch())
    t = torch.tensor([0.3, 0.6, 0.9])
    with torch.no_grad():
        cache = model.encode_condition(**cond)
        cached = model.forward_targets(target["ids"], t, target["segment_ids"], target["positions"], cache,
                                       attention_mask=target["attention_mask"])
        for b in range(3):
            n_target = int(target["attention_mask"][b].sum())
            reference = full_forward_of_sample(model, cond, target, b, t)
            torch.testing.assert_close(cached.logits[b, :n_target], reference, atol=1e-5, rtol=1e-5)
            assert torch.equal(cached.logits[b, :n_target].argmax(-1), reference.argmax(-1))
    assert torch.isfinite(cached.logits).all() and torch.isfinite(cached.critic).all()


def test_padded_full_forward_equals_cache(model):
    """The uncached model on the padded concatenation (padding in the middle) gives the cached result too."""
    cond, target = split_batch(ragged_condition_batch())
    t = torch.tensor([0.3, 0.6, 0.9])
    joined = {key: torch.cat([cond[key], target[key]], dim=1) for key in cond}
    is_target = torch.cat([torch.zeros_like(cond["attention_mask"]), torch.ones_like(target["attention_mask"])], 1)
    with torch.no_grad():
        full = model(joined["ids"], t, joined["segment_ids"], joined["positions"], is_target,
                     attention_mask=joined["attention_mask"])
        cached = model.forward_targets(target["ids"], t, target["segment_ids"], target["positions"],
                                       model.encode_condition(**cond), attention_mask=target["attention_mask"])
    real = target["attention_mask"]
    torch.testing.assert_close(full.logits[:, cond["ids"].shape[1]:][real], cached.logits[real], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(full.logits).all() and torch.isfinite(full.hidden).all()


def test_empty_condition_and_cache_concatenation(model):
    """A zero-length condition; and cat([conditional, unconditional]) as a CFG batch equals separate passes."""
    cond, target = split_batch(ragged_condition_batch()[:1])
    t = torch.tensor([0.5])
    args = (target["ids"], t, target["segment_ids"], target["positions"])
    with torch.no_grad():
        encoded_empty = model.encode_condition(cond["ids"][:, :0], cond["segment_ids"][:, :0],
                                               cond["positions"][:, :0])
        assert encoded_empty.length == 0
        alone = model(target["ids"], t, target["segment_ids"], target["positions"],
                      torch.ones_like(target["attention_mask"]))
        unconditional = model.forward_targets(*args, encoded_empty)
        conditional = model.forward_targets(*args, model.encode_condition(**cond))
        both = ConditionCache.cat([model.encode_condition(**cond), model.empty_condition(1)])
        doubled = [torch.cat([x, x]) for x in args]
        batched = model.forward_targets(*doubled, both)
    torch.testing.assert_close(unconditional.logits, alone.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched.logits, torch.cat([conditional.logits, unconditional.logits]),
                               atol=1e-5, rtol=1e-5)
    repeated = model.encode_condition(**cond).repeat_interleave(2)
    assert repeated.batch_size == 2 and torch.equal(repeated.keys[0][0], repeated.keys[0][1])


def test_padding_positions_stay_finite(model):
    inputs = sample_inputs(batch=3, length=8)
    attention_mask = torch.ones(3, 8, dtype=torch.bool)
    attention_mask[0, 5:] = False  # tail padding
    attention_mask[2] = False  # a row of padding only
    inputs["segment_ids"] = inputs["segment_ids"].masked_fill(~attention_mask, SEG_PAD)
    out = model(**inputs, attention_mask=attention_mask)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.critic).all()
    assert torch.isfinite(out.hidden).all()


def test_save_and_load_round_trip(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = DiT.from_pretrained(tmp_path).eval()
    public = lambda config: {k: v for k, v in config.items() if not k.startswith("_")}  # noqa: E731
    assert public(loaded.config) == public(model.config)
    inputs = sample_inputs()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, atol=0, rtol=0)


def test_rotary_depends_only_on_position_differences(model):
    inputs = sample_inputs()
    shifted = dict(inputs, positions=inputs["positions"] + 37)
    torch.testing.assert_close(model(**shifted).logits, model(**inputs).logits, atol=1e-4, rtol=1e-4)
    # 2-D: shifting rows and columns by different amounts changes nothing either ...
    grid = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij"), -1).reshape(1, 12, 2)
    image = dict(inputs, positions=grid.expand(2, 12, 2), segment_ids=torch.full((2, 12), SEG_IMAGE))
    moved = dict(image, positions=image["positions"] + torch.tensor([5, 11]))
    torch.testing.assert_close(model(**moved).logits, model(**image).logits, atol=1e-4, rtol=1e-4)
    # ... but positions do matter: transposing the grid changes the outputs
    transposed = dict(image, positions=image["positions"].flip(-1))
    assert not torch.allclose(model(**transposed).logits, model(**image).logits, atol=1e-4)


def test_bf16_autocast_on_cpu(model):
    model.train()
    inputs = sample_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**inputs)
        loss = F.cross_entropy(out.logits.flatten(0, 1), inputs["ids"].flatten())
    loss.backward()
    assert out.logits.dtype == torch.float32 and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        plain = model.eval()(**inputs).logits
    torch.testing.assert_close(out.logits.detach(), plain, atol=0.1, rtol=0.1)


def test_bad_inputs_raise_input_error(model):
    inputs = sample_inputs()
    with pytest.raises(InputError, match="tiny, mini, small, base"):
        DiT.from_preset("huge", vocab_size=VOCAB)
    with pytest.raises(InputError, match="unknown DiT config"):
        DiT.from_preset("tiny", vocab_size=VOCAB, widht=3)
    bad_cases = [
        dict(ids=inputs["ids"].masked_fill(inputs["ids"] == inputs["ids"][0, 0], VOCAB)),  # id out of range
        dict(ids=inputs["ids"] - VOCAB),  # negative ids
        dict(ids=inputs["ids"].float()),
        dict(ids=inputs["ids"][0]),
        dict(positions=inputs["positions"] - 1),
        dict(positions=inputs["positions"][..., 0]),
        dict(segment_ids=inputs["segment_ids"] + 7),
        dict(is_target=inputs["is_target"].long()),
        dict(t=torch.tensor([0.5])),
        dict(t=torch.tensor([0.5, 1.5])),
    ]
    for bad in bad_cases:  # each refused by a message that begins with the input it names
        (name,) = bad
        with pytest.raises(InputError, match=f"^{name} (must|is)"):
            model(**{**inputs, **bad})
    with pytest.raises(InputError, match="^attention_mask must be a bool tensor"):
        model(**inputs, attention_mask=torch.ones(2, 12))


def test_flops_per_token():
    model = DiT.from_preset("tiny", vocab_size=VOCAB)
    width, layers = 64, 2
    expected = 2 * (layers * 12 * width * width + width * 32 + 32) + layers * 4 * 100 * width + 2 * width * VOCAB
    assert flops_per_token(model, 100) == expected == flops_per_token(dict(model.config), 100)


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", vocab_size=VOCAB).train()
    inputs = sample_inputs(batch=4, length=16, seed=3)
    answers = inputs["ids"].clone()
    masked = inputs["is_target"] & (torch.rand(4, 16) < 0.5)
    inputs["ids"] = inputs["ids"].masked_fill(masked, MASK)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = F.cross_entropy(model(**inputs).logits[inputs["is_target"]], answers[inputs["is_target"]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


def test_neighbour_inputs_give_a_masked_caption_slot_its_nearest_shown_neighbours():
    from unimodal.backbone.dit import MASK_ID, NEIGHBOUR_GAPS, TEXT_SEGMENT

    assert (MASK_ID, TEXT_SEGMENT) == (MASK, SEG_TEXT)  # the backbone's copies of the layout's ids
    torch.manual_seed(0)
    model = randomized(DiT.from_preset("tiny", vocab_size=VOCAB, neighbour_inputs=True))
    plain = randomized(DiT.from_preset("tiny", vocab_size=VOCAB))
    assert plain.neighbours is None and not plain.config.neighbour_inputs
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in plain.parameters()) == \
        2 * (VOCAB + NEIGHBOUR_GAPS) * model.config.hidden_size
    #            image   | caption: 20  M  M  21  M  | image (masked)
    ids = torch.tensor([[30, 31, 20, MASK, MASK, 21, MASK, MASK]])
    segments = torch.tensor([[SEG_IMAGE, SEG_IMAGE, SEG_TEXT, SEG_TEXT, SEG_TEXT, SEG_TEXT, SEG_TEXT, SEG_IMAGE]])
    features = model.neighbour_embedding(ids, segments)
    n = model.neighbours
    token, gap = lambda side, i: n[f"{side}_token"].weight[i], lambda side, d: n[f"{side}_gap"].weight[d]
    expected = {3: token("left", 20) + gap("left", 1) + token("right", 21) + gap("right", 2),
                4: token("left", 20) + gap("left", 2) + token("right", 21) + gap("right", 1),
                6: token("left", 21) + gap("left", 1)}  # nothing shown after it in its caption
    for slot in range(ids.shape[1]):
        want = expected.get(slot, torch.zeros(model.config.hidden_size))  # shown, or not a caption's: nothing
        torch.testing.assert_close(features[0, slot], want)
    far = torch.tensor([[20] + [MASK] * 20])
    gaps = model.neighbour_embedding(far, torch.full_like(far, SEG_TEXT))[0] - token("left", 20)
    torch.testing.assert_close(gaps[20], gap("left", NEIGHBOUR_GAPS - 1))  # farther than 15 counts as 15
    with pytest.raises(InputError, match="neighbour_inputs must be a bool"):
        DiT.from_preset("tiny", vocab_size=VOCAB, neighbour_inputs="yes")


def test_neighbour_inputs_agree_on_every_forward_path(tmp_path):
    """Padded, unpadded with shared conditions, and the sampler's cached target-only forward give the same values:
    the neighbours are read within a caption, which every path holds whole."""
    torch.manual_seed(0)
    model = randomized(DiT.from_preset("tiny", vocab_size=VOCAB, neighbour_inputs=True))
    generator = torch.Generator().manual_seed(3)
    cond_ids = torch.randint(16, VOCAB, (2, 4), generator=generator)
    caption = torch.randint(16, VOCAB, (2, 7), generator=generator)
    caption[0, [1, 2, 5]] = MASK
    caption[1, 1:] = MASK
    ids = torch.cat([cond_ids, caption], 1)
    segment_ids = torch.cat([torch.full((2, 4), SEG_IMAGE), torch.full((2, 7), SEG_TEXT)], 1)
    positions = text_positions(2, 11)
    is_target = torch.cat([torch.zeros(2, 4, dtype=torch.bool), torch.ones(2, 7, dtype=torch.bool)], 1)
    t = torch.tensor([0.4, 0.9])
    with torch.no_grad():
        full = model(ids, t, segment_ids, positions, is_target)
        twice = model(ids.repeat(2, 1), t.repeat(2), segment_ids.repeat(2, 1), positions.repeat(2, 1, 1),
                      is_target.repeat(2, 1), unpad=True, copies=2)
        cache = model.encode_condition(cond_ids, segment_ids[:, :4], positions[:, :4])
        cached = model.forward_targets(caption, t, segment_ids[:, 4:], positions[:, 4:], cache)
    torch.testing.assert_close(twice.logits[:2], full.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached.logits, full.logits[:, 4:], atol=1e-5, rtol=1e-5)
    model.save_pretrained(tmp_path)
    loaded = DiT.from_pretrained(tmp_path)
    assert loaded.config.neighbour_inputs and torch.equal(loaded.neighbours["right_gap"].weight,
                                                          model.neighbours["right_gap"].weight)
