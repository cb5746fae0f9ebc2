#!/usr/bin/env python3
"""The Hugging Face transformers baseline of l3-bench-train-throughput, run on the same GPU in the
same session: LlamaForCausalLM (SFT) or LlamaForSequenceClassification with one label (reward,
Bradley-Terry loss) built from the same shape as llama3-hpc's presets (random init, no downloads),
fp32 parameters with bf16 autocast (what `Trainer(bf16=True)` does), attn_implementation="sdpa",
fused AdamW, one micro-batch per optimizer step.

Every row is seq random tokens, all in the loss (SFT); a reward pair is two sequences of seq/2.
Tokens/s is the median over the timed steps after warm-up; MFU uses the PaLM formula with the
same N as llama3-hpc (no input embedding; lm_head for SFT, the score vector for reward).

  python3 hf_train.py --model llama3.2-1b|llama3-8b [--layers N] --phase sft|reward --seq 2048
                      --micro-batch B [--steps 10] [--warmup 3] [--peak-tflops T] [--json FILE]
Prints one JSON object (also written to --json); on out-of-memory it says so with "error".
"""
import argparse
import json
import statistics
import sys
import time

SHAPES = {  # the presets of src/model/model_config.cpp
    "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=64, rope_theta=500000.0, tie_word_embeddings=True,
                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, rope_theta=500000.0, tie_word_embeddings=False,
                      rope_scaling=None),
}


def flop_parameters(shape, layers, lm_head):
    h, i = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    block = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return layers * block + h + (shape["vocab_size"] if lm_head else 1) * h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--phase", choices=["sft", "reward"], default="sft")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--datasheet-tflops", type=float, default=989.0)
    ap.add_argument("--json")
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    shape = dict(SHAPES[a.model])
    layers = a.layers or shape["num_hidden_layers"]
    shape["num_hidden_layers"] = layers
    config = LlamaConfig(**shape, max_position_embeddings=max(8192, a.seq), rms_norm_eps=1e-5,
                         attn_implementation="sdpa", pad_token_id=0, num_labels=1)
    name = a.model if layers == SHAPES[a.model]["num_hidden_layers"] else f"{a.model}-{layers}layers"
    row = {"impl": "transformers", "model": name, "phase": a.phase, "seq": a.seq,
           "micro_batch": a.micro_batch, "torch": torch.__version__,
           "transformers": transformers.__version__}
    try:
        torch.manual_seed(0)
        cls = LlamaForCausalLM if a.phase == "sft" else LlamaForSequenceClassification
        model = cls(config).cuda()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, fused=True)
        rows = a.micro_batch if a.phase == "sft" else 2 * a.micro_batch
        length = a.seq if a.phase == "sft" else a.seq // 2

        def step():
            ids = torch.randint(0, shape["vocab_size"], (rows, length), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if a.phase == "sft":
                    loss = model(input_ids=ids, labels=ids).loss
                else:
                    scores = model(input_ids=ids).logits.float().view(-1)
                    chosen, rejected = scores[0::2], scores[1::2]
                    loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        times = []
        for s in range(a.warmup + a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step()
            loss.item()
            torch.cuda.synchronize()
            if s >= a.warmup:
                times.append(time.perf_counter() - t0)
        step_s = statistics.median(times)
        tokens = a.micro_batch * a.seq
        tps = tokens / step_s
        flops = 6 * flop_parameters(shape, layers, a.phase == "sft") + 12 * layers * shape["hidden_size"] * length
        achieved = tps * flops / 1e12
        row.update(tokens_per_s=tps, step_ms=1e3 * step_s, data_wait_ms=0.0,
                   achieved_tflops=achieved, last_loss=float(loss.item()),
                   peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30)
        if a.peak_tflops > 0:
            row.update(mfu=achieved / a.peak_tflops, peak_tflops=a.peak_tflops)
        if a.datasheet_tflops > 0:
            row.update(mfu_datasheet=achieved / a.datasheet_tflops, datasheet_tflops=a.datasheet_tflops)
    except torch.cuda.OutOfMemoryError as e:
        row["error"] = f"out of memory: {str(e).splitlines()[0]}"
    text = json.dumps(row)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0 if "error" not in row else 3


if __name__ == "__main__":
    sys.exit(main())
