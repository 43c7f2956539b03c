"""The head's stepping layer (engine/drafters/head_step.py) against its trained layer stepped as
it is (head_net.HeadNet, the layer drafting ran before 0042), in one process, alternated: the same
DraftHead, the same cache and tables, only `head.net` swapped. Each line is `DraftHead.measure`
(fastest of --reps) for a few row counts, in ms. int8 weights on a CPU, as a run picks there.
Then a step's attention alone, torch's kernel (`attend`) against `attend_few`, by query rows
against the head's whole cache, fastest of 200.

    python dev/head_layer_ab.py --model target.gguf --head head.npz [--rounds 4] [--reps 20]
"""
from __future__ import annotations

import argparse
import warnings

from localspec.engine.llama_model import LlamaModel  # llama.cpp before torch: the GPU host needs it

import torch  # noqa: E402

from localspec.engine.drafters.head import TREE, WINDOW, DraftHead  # noqa: E402
from localspec.engine.drafters.head_net import HeadNet, attend  # noqa: E402
from localspec.engine.drafters.head_step import attend_few  # noqa: E402

from head_step_probe import fastest  # noqa: E402  (dev/, the script's own folder)
from localspec.models.head_file import read_head  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    meta = LlamaModel(args.model, n_ctx=256, n_seq_max=1, n_gpu_layers=0, hidden=True)
    n_embd, vocab = meta.n_embd, meta.vocab_size
    meta.close()
    head = DraftHead(args.head, args.model, n_embd=n_embd, vocab_size=vocab, int8=True, device="cpu")
    trained = HeadNet(head.shape)
    trained.load_arrays(read_head(head.path)[1])
    with warnings.catch_warnings():   # torch.ao's deprecation notice, as DraftHead silences it
        warnings.simplefilter("ignore")
        spec = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        trained = torch.ao.quantization.quantize_dynamic(trained.eval(), spec, dtype=torch.qint8)
    layers = {"trained layer": trained, "stepping layer": head.net}
    print(f"head {head.path.name}, int8 weights, {torch.get_num_threads()} threads; ms a step by rows")
    for _ in range(args.rounds):
        for name, net in layers.items():
            head.net = net
            steps = head.measure((1, 2, 4, 8), reps=args.reps)
            print(f"{name:<15} " + "  ".join(f"{n}: {1e3 * s:.3f}" for n, s in steps.items()), flush=True)
    shape, g = head.shape, torch.Generator().manual_seed(0)
    k = torch.randn(1, WINDOW + TREE, shape.kv_heads, shape.head_dim, generator=g)
    v = torch.randn_like(k)
    print("attention alone, ms by query rows (torch's kernel / attend_few):")
    for n in (1, 2, 4, 8, 32):
        q = torch.randn(1, n, shape.heads, shape.head_dim, generator=g)
        mask = torch.rand(1, n, WINDOW + TREE, generator=g) < 0.4
        times = [fastest(lambda fn=fn: fn(q, k, v, mask), 200, lambda: None) for fn in (attend, attend_few)]
        print(f"  {n:>2} rows  {1e3 * times[0]:.3f} / {1e3 * times[1]:.3f}")


if __name__ == "__main__":
    main()
