"""Oracle for the sampler: Hugging Face's logits processors and warpers applied, in generate()'s
order, to the cases in argv[1]; writes the kept mask and the warped scores to argv[2].
Exit code 77 when transformers is not importable (the C++ test then skips)."""
import json
import sys

try:
    import torch
    from transformers.generation.logits_process import (NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor,
                                                        TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
except ImportError as e:
    print(f"no transformers: {e}", file=sys.stderr)
    sys.exit(77)

try:
    from transformers.generation.logits_process import MinPLogitsWarper
except ImportError:  # transformers < 4.41 (the pinned 4.40.2): the same rule, written out

    class MinPLogitsWarper:
        def __init__(self, min_p, filter_value=-float("inf"), min_tokens_to_keep=1):
            self.min_p, self.filter_value, self.min_tokens_to_keep = min_p, filter_value, min_tokens_to_keep

        def __call__(self, input_ids, scores):
            probs = torch.softmax(scores, dim=-1)
            top_probs, _ = probs.max(dim=-1, keepdim=True)
            tokens_to_remove = probs < self.min_p * top_probs
            sorted_indices = torch.argsort(scores, descending=True, dim=-1)
            sorted_indices_to_remove = torch.gather(tokens_to_remove, dim=-1, index=sorted_indices)
            sorted_indices_to_remove[..., : self.min_tokens_to_keep] = False
            indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
            return scores.masked_fill(indices_to_remove, self.filter_value)


def warp(case):
    o = case["options"]
    ids = torch.tensor([case["context"]], dtype=torch.long)
    scores = torch.tensor([case["logits"]], dtype=torch.float32)
    steps = []
    if o["repetition_penalty"] != 1.0:
        steps.append(RepetitionPenaltyLogitsProcessor(o["repetition_penalty"]))
    if o["no_repeat_ngram_size"] > 0:
        steps.append(NoRepeatNGramLogitsProcessor(o["no_repeat_ngram_size"]))
    if o["temperature"] != 1.0:
        steps.append(TemperatureLogitsWarper(o["temperature"]))
    if o["top_k"] > 0:
        steps.append(TopKLogitsWarper(o["top_k"]))
    if o["top_p"] < 1.0:
        steps.append(TopPLogitsWarper(o["top_p"]))
    if o["min_p"] > 0.0:
        steps.append(MinPLogitsWarper(o["min_p"]))
    for step in steps:
        scores = step(ids, scores)
    s = scores[0]
    kept = torch.isfinite(s)
    return {"kept": kept.tolist(), "scores": torch.where(kept, s, torch.zeros_like(s)).tolist()}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    with open(sys.argv[2], "w") as f:
        json.dump([warp(c) for c in cases], f)


if __name__ == "__main__":
    main()
