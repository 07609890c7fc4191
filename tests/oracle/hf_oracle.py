"""What the Hugging Face oracle scripts (hf_model.py, hf_checkpoint.py) share: importing torch and
transformers or exiting 77, a seeded random causal LM, and a fixture folder published atomically."""
import importlib
import os
import shutil
import sys
import time

from oracle_fixture import NO_TORCH_EXIT, import_torch

torch = import_torch()
try:
    import transformers
    importlib.import_module("safetensors.torch")  # the scripts' save_file/load_file: missing, it skips here
except ImportError as e:
    print(f"transformers/safetensors not importable ({e}): run scripts/setup --test", file=sys.stderr)
    sys.exit(NO_TORCH_EXIT)

CONFIG_CLASSES = {"LlamaForCausalLM": transformers.LlamaConfig, "Qwen2ForCausalLM": transformers.Qwen2Config,
                  "MistralForCausalLM": transformers.MistralConfig}


def random_causal_lm(arch, fields, seed, weight_std):
    """An f32 `arch` with config `fields` and eager attention, every parameter drawn from `seed`:
    weights ~ N(0, weight_std), norm weights ~ 1 + N(0, 0.2), biases ~ N(0, 0.1) -- norms and
    biases random too, so a loader or forward that mishandles one shows."""
    torch.manual_seed(seed)
    config = CONFIG_CLASSES[arch](hidden_act="silu", torch_dtype="float32", **fields)
    model = getattr(transformers, arch)._from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(weight_std * torch.randn_like(p))
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "HF did not tie the embeddings"
    return model.eval()


class StagedFixture:
    """The fixture folder of a script run as `script OUT.json`: OUT without its extension (`root`).

    Tests running in parallel may each regenerate the fixture, so everything is written under a
    private `tmp_root` first and renamed into place by publish(): no test ever reads a half-written
    file. The content is seeded, so whichever copy wins is the same."""

    def __init__(self, usage):
        if len(sys.argv) != 2:
            sys.exit(usage)
        self.started = time.time()
        self.out = os.path.abspath(sys.argv[1])
        self.root = os.path.splitext(self.out)[0]
        self.tmp_root = f"{self.root}.tmp.{os.getpid()}"
        shutil.rmtree(self.tmp_root, ignore_errors=True)

    def publish(self):
        """Moves tmp_root to root. A root published by a run that began before this one is stale
        and replaced; one published after this run started comes from a concurrent run of the same
        script (identical, seeded content) and may be in use, so it is kept and ours dropped."""
        with open(os.path.join(self.tmp_root, "published"), "w") as f:
            f.write(repr(time.time()))
        try:
            with open(os.path.join(self.root, "published")) as f:
                if float(f.read()) >= self.started:
                    shutil.rmtree(self.tmp_root, ignore_errors=True)
                    return
        except (OSError, ValueError):
            pass
        old = f"{self.root}.old.{os.getpid()}"
        try:
            os.rename(self.root, old)
        except FileNotFoundError:
            old = None
        try:
            os.rename(self.tmp_root, self.root)
        except OSError:
            shutil.rmtree(self.tmp_root, ignore_errors=True)
        if old:
            shutil.rmtree(old, ignore_errors=True)
