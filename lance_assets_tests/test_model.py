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
