#!/usr/bin/env python3
"""The Hugging Face transformers baseline of l3-bench-train-throughput, run on the same GPU in the
same session: LlamaForCausalLM (SFT) or LlamaForSequenceClassification with one label (reward,
Bradley-Terry loss) built from the same shape as llama3-hpc's presets (random init, no downloads),
fp32 parameters with bf16 autocast (what `Trainer(bf16=True)` does), attn_implementation="sdpa",
fused AdamW, one micro-batch per optimizer step; gradient checkpointing where llama3-hpc's row
used --recompute.

Every row is seq random tokens, all in the loss (SFT); a reward pair is two sequences of seq/2.
Tokens/s is the median over the timed steps after warm-up; MFU uses the PaLM formula with the
same N as llama3-hpc (no input embedding; lm_head for SFT, the score vector for reward).

  python3 hf_train.py --model llama3.2-1b|llama3-8b [--layers N] --phase sft|reward --seq 2048
                      --micro-batch B [--steps 10] [--warmup 3] [--peak-tflops T]
                      [--datasheet-tflops T] [--gradient-checkpointing] [--json FILE]
Prints one JSON object (also written to --json). Out of memory: the micro-batch is halved in the
same process down to 1 (the row lists the sizes that did not fit); exit 3 when 1 does not fit
either. Any other failure: exit 1 with the row's "error" saying what.
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
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()

    row = {"impl": "transformers", "phase": a.phase, "seq": a.seq}
    try:
        return run(a, row)
    except Exception as e:  # anything else: a row that says what, never a silent gap
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        emit(row, a.json)
        return 1


def emit(row, path):
    text = json.dumps(row)
    print(text, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


def out_of_memory(torch, e):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text)


def run(a, row):
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    row.update(torch=torch.__version__, transformers=transformers.__version__)
    shape = dict(SHAPES[a.model])
    layers = a.layers or shape["num_hidden_layers"]
    shape["num_hidden_layers"] = layers
    row["model"] = a.model if layers == SHAPES[a.model]["num_hidden_layers"] else f"{a.model}-{layers}layers"
    config = LlamaConfig(**shape, max_position_embeddings=max(8192, a.seq), rms_norm_eps=1e-5,
                         attn_implementation="sdpa", pad_token_id=0, num_labels=1,
                         use_cache=False)
    cls = LlamaForCausalLM if a.phase == "sft" else LlamaForSequenceClassification
    torch.manual_seed(0)
    # Built on the GPU: initialising an 8B-shaped model on the CPU and copying it takes minutes.
    try:
        with torch.device("cuda"):
            model = cls(config)
    except (AttributeError, TypeError):  # torch < 2.0: no device context
        model = cls(config).cuda()
    if a.gradient_checkpointing:  # what llama3-hpc's --recompute does
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        row["gradient_checkpointing"] = True
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, fused=True)
    # Out of memory: halve the micro-batch in this process (the model and optimizer stay), down
    # to one row; exit 3 only when even that does not fit.
    batch = a.micro_batch
    while True:
        row["micro_batch"] = batch
        try:
            measure(a, row, torch, model, optimizer, shape, layers, batch)
            emit(row, a.json)
            return 0
        except Exception as e:
            if not out_of_memory(torch, e):
                raise
            message = str(e).splitlines()[0]
        # Outside the handler: the exception's frames, which hold the step's activations, are gone.
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        row.setdefault("out_of_memory_at", []).append(batch)
        if batch == 1:
            row["error"] = f"out of memory: {message}"
            emit(row, a.json)
            return 3
        batch //= 2


def measure(a, row, torch, model, optimizer, shape, layers, batch):
    rows = batch if a.phase == "sft" else 2 * batch
    length = a.seq if a.phase == "sft" else a.seq // 2

    def step():
        # Ids from 1: 0 is the pad id, which would move the reward head's read-out.
        ids = torch.randint(1, shape["vocab_size"], (rows, length), device="cuda")
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
    tokens = batch * a.seq
    tps = tokens / step_s
    flops = 6 * flop_parameters(shape, layers, a.phase == "sft") + 12 * layers * shape["hidden_size"] * length
    achieved = tps * flops / 1e12
    row.pop("error", None)
    row.update(tokens_per_s=tps, step_ms=1e3 * step_s, data_wait_ms=0.0,
               achieved_tflops=achieved, last_loss=float(loss.item()),
               peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30)
    if a.peak_tflops > 0:
        row.update(mfu=achieved / a.peak_tflops, peak_tflops=a.peak_tflops)
    if a.datasheet_tflops > 0:
        row.update(mfu_datasheet=achieved / a.datasheet_tflops, datasheet_tflops=a.datasheet_tflops)


if __name__ == "__main__":
    sys.exit(main())
