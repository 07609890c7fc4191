#!/usr/bin/env python3
"""The layering contract, checked on the include graph (run by CTest as contract.include_graph).

The build already links each component (src/<name>) only to the components below it
(corelm_component(...) in CMakeLists.txt). Link order alone lets a component include a header of
a component above it as long as it only uses inline code, so this check reads every #include in
src/ and apps/ and fails when:
  * a file of component A includes a header owned by component B, and B is not A, nor below A
    in the link graph that CMakeLists.txt declares;
  * a file above ops includes kernels/ (DESIGN.md: "nothing above ops includes kernels/"),
    except the files listed in KNOWN_KERNEL_INCLUDES, the debt issue 17 removes when the CPU
    backend moves behind the inference seam; an entry that no longer includes kernels/ is
    reported too, so the list only shrinks;
  * a public header in include/corelm/ has no owner in HEADER_OWNER (a new header must say
    which component it belongs to).
Usage: check_layering.py [SOURCE_DIR]. Prints one line per violation; exit 1 if any.
"""
import os
import re
import sys

# Who owns each public header: the component whose sources define what it declares.
HEADER_OWNER = {
    "architecture.h": "model", "autocast.h": "ops", "autograd.h": "autograd", "bench_matrix.h": "infer", "c_api.h": "capi",
    "chat_template.h": "infer",
    "constraint.h": "infer", "corpus_build.h": "pipeline", "device.h": "core", "dtype.h": "core",
    "durable.h": "core", "error.h": "core", "eval_task.h": "pipeline", "finite.h": "core", "hash.h": "core",
    "generate.h": "infer", "gguf.h": "io", "isa.h": "kernels", "kv_cache_type.h": "model",
    "llama2c.h": "io", "model.h": "model", "model_dir.h": "model", "model_loader.h": "model",
    "mpi.h": "dist", "ops.h": "ops", "optim.h": "train", "out_of_memory.h": "core",
    "perplexity.h": "pipeline", "pipeline.h": "pipeline", "queue.h": "queue", "random.h": "core", "safetensors.h": "io",
    "scheduler.h": "infer", "serve.h": "serve", "storage.h": "core", "tensor.h": "core",
    "thread_pool.h": "core", "token_ids.h": "tokenizer", "tokenizer.h": "tokenizer",
    "tokenizer_corpus.h": "tokenizer", "tokenizer_train.h": "tokenizer", "train.h": "train",
    "utf8.h": "core",
}

# Files above ops that still reach into kernels/ directly: only the bench command, which measures
# the kernels themselves (the model reaches them through ops/inference_backend.h since issue 17,
# train through ops/vector_math.h).
KNOWN_KERNEL_INCLUDES = {
    "apps/cmd_bench_gemm.cc",
}

# Components that sit above everything: they may include any library header.
TOP = {"apps", "capi"}
KERNEL_USERS = {"kernels", "ops"}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
COMPONENT_RE = re.compile(r"corelm_component\(\s*(\w+)([^)]*)\)")


def link_graph(root):
    """{component: set of components it links directly}, from CMakeLists.txt."""
    text = open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8").read()
    text = re.sub(r"#[^\n]*", "", text)
    graph = {}
    for name, rest in COMPONENT_RE.findall(text):
        if name == "name":  # the function definition itself
            continue
        graph[name] = {d[len("corelm_"):] for d in rest.split() if d.startswith("corelm_")}
    return graph


def below(graph):
    """{component: every component reachable through its links, itself included}."""
    out = {}
    def walk(c, seen):
        for d in graph.get(c, ()):
            if d not in seen:
                seen.add(d)
                walk(d, seen)
        return seen
    for c in graph:
        out[c] = walk(c, {c})
    return out


def owner_of(include, src_components):
    """The component owning an included path, or None for system / third-party headers."""
    if include.startswith("corelm/"):
        return HEADER_OWNER.get(include[len("corelm/"):], "?")
    first = include.split("/", 1)[0]
    if "/" in include and first in src_components:
        return first
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
    graph = link_graph(root)
    reach = below(graph)
    src_components = {d for d in os.listdir(os.path.join(root, "src")) if os.path.isdir(os.path.join(root, "src", d))}
    problems = []

    for h in sorted(os.listdir(os.path.join(root, "include", "corelm"))):
        if h.endswith(".h") and h not in HEADER_OWNER:
            problems.append(f"include/corelm/{h}: no owning component in HEADER_OWNER (tests/contract/check_layering.py)")

    debt_seen = set()
    files = 0
    for top in ("src", "apps"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if not n.endswith((".h", ".cc", ".cpp", ".hpp")):
                    continue
                path = os.path.join(dirpath, n)
                rel = os.path.relpath(path, root)
                parts = rel.split(os.sep)
                comp = "apps" if parts[0] == "apps" else parts[1]
                if comp not in TOP and comp not in graph:
                    problems.append(f"{rel}: src/{comp} is not a component declared in CMakeLists.txt")
                    continue
                files += 1
                text = open(path, encoding="utf-8", errors="replace").read()
                for inc in INCLUDE_RE.findall(text):
                    owner = owner_of(inc, src_components)
                    if owner is None or owner == comp:
                        continue
                    if owner == "?":
                        problems.append(f"{rel}: includes {inc}, a public header with no owner")
                        continue
                    if owner == "kernels" and comp not in KERNEL_USERS:
                        if rel in KNOWN_KERNEL_INCLUDES:
                            debt_seen.add(rel)
                            continue
                        if not inc.startswith("corelm/"):
                            problems.append(f"{rel}: includes {inc}: nothing above ops includes kernels/ (go through ops)")
                            continue
                    if comp in TOP:
                        continue
                    if owner not in reach[comp]:
                        problems.append(f"{rel}: component {comp} includes {inc} of component {owner}, "
                                        f"which is not below it (links: {', '.join(sorted(graph[comp])) or 'none'})")
    for stale in sorted(KNOWN_KERNEL_INCLUDES - debt_seen):
        problems.append(f"{stale}: listed in KNOWN_KERNEL_INCLUDES but no longer includes kernels/: drop it from the list")

    for p in problems:
        print(p)
    print(f"check_layering: {files} files, {len(graph)} components, {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
