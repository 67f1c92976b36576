import torch

from lance_assets.train.data import inputs_and_targets
from lance_assets.train.model import GPT, config_for


def test_presets_and_vocab_padding():
    cfg = config_for("small", vocab_size=50258, block_size=1024)
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd) == (12, 12, 768)
    assert cfg.vocab_size % 64 == 0 and cfg.vocab_size >= 50258
    # GPT-2 124M: ~85M parameters outside the embeddings
    model = GPT(cfg)
    body = model.num_params() - model.wte.weight.numel()
    assert 84e6 < body < 86e6


def test_padding_is_masked_out_of_the_loss():
    torch.manual_seed(0)
    model = GPT(config_for("tiny", vocab_size=258, block_size=16))
    pad = 257
    blocks = torch.randint(0, 256, (2, 17))
    blocks[1, 9:] = pad
    x, y = inputs_and_targets(blocks, pad)
    assert (y[1, 8:] == -1).all() and (y[0] != -1).all()
    logits, loss = model(x, y)
    manual = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1))[y.view(-1) != -1],
                                               y.view(-1)[y.view(-1) != -1])
    assert torch.allclose(loss, manual, atol=1e-5)


def test_generate_never_emits_banned_ids():
    torch.manual_seed(0)
    model = GPT(config_for("tiny", vocab_size=258, block_size=32))
    with torch.no_grad():
        model.lm_head.weight[257] += 5.0  # make PAD the most likely token
    banned = [257, *range(258, model.cfg.vocab_size)]
    out = model.generate(torch.tensor([[256]]), 64, temperature=1.0, top_k=None, banned=banned)
    assert not set(out[0, 1:].tolist()) & set(banned)


def test_modern_starts_uniform_unties_the_head_and_has_no_position_table():
    torch.manual_seed(0)
    model = GPT(config_for("tiny", vocab_size=258, block_size=16, arch="modern"))
    assert model.wpe is None and model.lm_head.weight is not model.wte.weight
    x = torch.randint(0, 258, (2, 16))
    logits, loss = model(x, x)
    # zero-initialised head: every id equally likely; soft-capping bounds the logits
    assert torch.allclose(loss, torch.log(torch.tensor(float(model.cfg.vocab_size))), atol=1e-5)
    model.lm_head.weight.data.normal_(0, 100.0)
    assert model(x)[0].abs().max() <= 15.0


def test_rotary_scores_depend_only_on_relative_position():
    from lance_assets.train.model import apply_rotary, rotary_tables

    torch.manual_seed(0)
    cos, sin = rotary_tables(block_size=8, head_dim=16)
    q = torch.randn(16).expand(1, 1, 8, 16)
    k = torch.randn(16).expand(1, 1, 8, 16)
    scores = apply_rotary(q, cos, sin)[0, 0] @ apply_rotary(k, cos, sin)[0, 0].T
    for m in range(6):
        for n in range(6):
            assert torch.allclose(scores[m, n], scores[m + 2, n + 2], atol=1e-4)


def test_modern_learns_a_batch_with_muon_and_adamw():
    from lance_assets.train.config import TrainConfig
    from lance_assets.train.step import make_optimizers, train_step

    torch.manual_seed(0)
    cfg = TrainConfig(arch="modern", seq_len=32)
    model = GPT(config_for("tiny", vocab_size=258, block_size=32, arch="modern"))
    optimizers = make_optimizers(model, cfg, torch.device("cpu"))
    assert [type(o).__name__ for o in optimizers] == ["Muon", "AdamW"]
    muon_params = {id(p) for g in optimizers[0].param_groups for p in g["params"]}
    assert id(model.wte.weight) not in muon_params and id(model.lm_head.weight) not in muon_params
    blocks = torch.randint(0, 256, (8, 33))
    losses = [train_step(model, optimizers, iter([blocks]), pad_id=257,
                         device=torch.device("cpu")).loss for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
