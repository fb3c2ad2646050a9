"""Load a portable artifact and run it: the runtime-facing ``CompiledLM``.

Weights are read once from ``weights/`` into the model and passed to the compiled layer and head graphs as inputs on
every call (no copy), from one huge-page arena (models/weight_arena.py); with ``linear_kernels`` the graphs' linears
call neuronpack's decode kernels, registered first from the artifact's own ``neuronpack_kernels.so`` copy
(models/linear_kernels.py). The KV cache (one K and one V tensor
``[layers, batch_size, kv_heads, seq_len + 1, head_dim]``) is owned here: the layer graphs read it and return the
K/V of the tokens they ran, which ``store_kv`` writes at their positions.

Example::

    lm = load_artifact(Path("neuron-compiled-artifacts/3f2a..."))
    logits = lm.prefill([0], [[1, 42, 7]])                                   # [1, vocab]
    logits = lm.decode(torch.tensor([logits.argmax()]), torch.tensor([3]), slots=[0])   # next step, [1, vocab]
    logits = lm.verify([0], [[5, 9, 2]], [4])      # [1, 3, vocab]: three tokens at positions 4..6 in one step
    every = lm.prompt_logits([1, 42, 7], slot=0)   # [3, vocab]: row i predicts token i+1 (teacher-forced)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.torch_aot import layout as L
from neuronpack.backends.torch_aot.layout import FORMAT, FORMAT_VERSION, GRAPHS_FILE, NEURON_CONFIG, WEIGHTS_DIR
from neuronpack.backends.torch_aot.lora import adapter_names, attach_artifact_lora
from neuronpack.backends.torch_aot.rows import RowMap
from neuronpack.backends.torch_aot.runners import load_runners
from neuronpack.backends.torch_aot.target import current_target, target_mismatch
from neuronpack.errors import ArtifactError, BucketError
from neuronpack.progress import NullReporter, Reporter

if TYPE_CHECKING:
    import torch

REQUIRED_FILES = (NEURON_CONFIG, GRAPHS_FILE, "config.json", f"{WEIGHTS_DIR}/config.json")


def read_neuron_config(artifact_dir: Path) -> dict[str, Any]:
    """The artifact's neuron_config.json, checked to be a portable (torch) artifact."""
    path = Path(artifact_dir) / NEURON_CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read {NEURON_CONFIG}: {exc}", where=str(path),
                            fix="rebuild it with neuronpack compile --framework torch") from None
    if config.get("format") != FORMAT:
        raise ArtifactError(f"not a torch-backend artifact (format {config.get('format')!r})", where=str(path),
                            fix="serve it with the framework it was compiled for, or recompile with --framework torch")
    if config.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"artifact format {config.get('format_version')} is not the format this neuronpack "
                            f"runs ({FORMAT_VERSION})", where=str(path),
                            fix="recompile it (neuronpack compile --force)")
    return config


def check_loadable(artifact_dir: Path, built_target: dict[str, Any]) -> None:
    """Raise ArtifactError if a file is missing or the artifact was built for another torch / CPU / device."""
    artifact_dir = Path(artifact_dir)
    for name in REQUIRED_FILES:
        if not (artifact_dir / name).is_file():
            raise ArtifactError(f"artifact is missing {name}", where=str(artifact_dir),
                                fix="recompile it (neuronpack compile --force)")
    if not any((artifact_dir / WEIGHTS_DIR).glob("*.safetensors")):
        raise ArtifactError("artifact has no weights", where=str(artifact_dir / WEIGHTS_DIR),
                            fix="recompile it (neuronpack compile --force)")
    here = current_target(built_target.get("compiler", "aoti"), built_target.get("device", "cpu"))
    problem = target_mismatch(built_target, here)
    if problem:
        raise ArtifactError(problem, where=str(artifact_dir),
                            fix="rebuild with neuronpack compile on this machine, or use compiler=export")


def load_artifact(artifact_dir: Path, *, device: str | None = None, reporter: Reporter | None = None):
    """Load a torch-backend artifact directory into a ready ``CompiledLM`` (KV cache allocated, zeroed).

    Example::

        lm = load_artifact(Path("artifacts/abc123"))
        lm.batch_size, lm.context_buckets        # (4, (128, 256))
    """
    reporter = reporter or NullReporter()
    import torch

    from neuronpack.checkpoint import open_checkpoint
    from neuronpack.models.loading import load_model
    from neuronpack.models.weight_arena import move_to_arena

    artifact_dir = Path(artifact_dir)
    config = read_neuron_config(artifact_dir)
    built = config["target"]
    if device is not None and device != built.get("device"):
        raise ArtifactError(f"built for device {built.get('device')}, asked to load on {device}",
                            where=str(artifact_dir), fix=f"recompile with target.instance = {device!r}")
    check_loadable(artifact_dir, built)
    dtype = getattr(torch, config["torch_dtype"])
    model = load_model(open_checkpoint(artifact_dir / WEIGHTS_DIR), dtype, max_seq_len=config["seq_len"],
                       reporter=reporter)
    attach_artifact_lora(model, config, artifact_dir)  # the lora_A / lora_B stacks, from lora/<name>/
    move_to_arena(model)  # huge pages: a decode step streams every weight (models/weight_arena.py)
    if config.get("linear_kernels"):  # before the graphs load: they call the kernels' ops by name
        from neuronpack.models.linear_kernels import use_kernels

        use_kernels(model, library=artifact_dir / L.KERNELS_LIBRARY)  # refuses an artifact without its copy
    with reporter.task(f"load graphs ({config['compiler']})", total=len(config["graphs"])) as task:
        runners = load_runners(artifact_dir / GRAPHS_FILE, config, task)
    return CompiledLM(config, model, runners, _eos_token_ids(artifact_dir))


class CompiledLM:
    """The loaded model, its compiled graphs and the KV cache they share. Slots ``0..batch_size-1`` are logical:
    ``RowMap`` keeps the active ones packed into the first cache rows, so a step over n slots runs at batch n.

    A step is ``LlamaForCausalLM.forward_step`` of the loaded model (its embedding, rotary tables and masks run
    eagerly: a few small ops) with the compiled layer and head graphs in place of its modules."""

    def __init__(self, config: dict[str, Any], model, runners: dict[str, Callable], eos: tuple[int, ...]):
        import torch

        from neuronpack.backends.torch_aot.graphs import head_weights, layer_weights

        self.config = config
        self.batch_size: int = config["batch_size"]
        self.context_buckets: tuple[int, ...] = tuple(config["context_encoding_buckets"])
        self.token_generation_buckets: tuple[int, ...] = tuple(config["token_generation_buckets"])
        self.max_seq_len: int = config["seq_len"]
        self.num_layers: int = config["num_layers"]
        self.vocab_size: int = config["vocab_size"]
        self.eos_token_ids: tuple[int, ...] = eos
        self.compiler: str = config["compiler"]
        self.dtype = getattr(torch, config["torch_dtype"])
        # Tokens per row one verify step may run (the longest prompt, at least speculation length + 1).
        self.max_verify_tokens: int = config["max_step_tokens"]
        self._model = model  # its tensors are the graphs' weight inputs (AOTInductor holds no copy)
        model.use_position_tables(config["kv_cache_positions"])  # every position a step can reach
        self._lm_head = model.lm_head  # prompt logits: the head over every prompt row, only when asked
        groups = config["layer_graphs"]
        suffix = [f".{g}" if g else "" for g in groups]
        self._layer_graphs = [(runners[L.LAYER_DECODE + s], runners[L.LAYER_STEP + s]) for s in suffix]
        self._layer_inputs = [layer_weights(model, i) for i in range(len(groups))]
        self._head = runners[L.HEAD]
        self._draft_runners = {name: runners[name] for name in L.DRAFT_GRAPHS if name in runners}
        self._head_inputs = head_weights(model)
        shape = (config["num_layers"], self.batch_size, config["num_kv_heads"], config["kv_cache_positions"],
                 config["head_dim"])
        self.k_cache = _untouched_zeros(shape, self.dtype)
        self.v_cache = _untouched_zeros(shape, self.dtype)
        # Per-layer views of the first n rows for every n (contiguous), built once.
        layers = range(config["num_layers"])
        self._row_views = [([self.k_cache[i, :n] for i in layers], [self.v_cache[i, :n] for i in layers])
                           for n in range(self.batch_size + 1)]
        self._rows = RowMap(self.batch_size)
        # LoRA: adapter index k (1-based) is adapter_names[k - 1]; a LoRA artifact's graph takes one index per row
        self.adapter_names: tuple[str, ...] = adapter_names(config)
        self._lora = bool(config.get("lora"))
        self._captured: dict[int, Any] | None = None  # during a step asked for hidden_layers: layer -> its input

    def draft_graphs(self, draft):
        """The artifact's compiled EAGLE draft graphs bound to ``draft`` (loaded from its ``draft/``), or None
        when the artifact has none (the draft then runs eagerly)."""
        if not self._draft_runners:
            return None
        from neuronpack.backends.torch_aot.draft_graphs import CompiledDraft

        return CompiledDraft(self._draft_runners, draft, self.max_verify_tokens,
                             kernels=bool(self.config.get("linear_kernels")))

    def _run_layer(self, i: int, x, cos, sin, masks, k_rows, v_rows, *lora):
        if self._captured is not None:
            self._captured[i] = x  # the residual stream entering layer i (EAGLE-3 reads three of them)
        decode, step = self._layer_graphs[i]
        graph = decode if x.shape[1] == 1 else step
        return graph(self._layer_inputs[i], x, cos, sin, masks.past, k_rows, v_rows, *lora)

    def _run_head(self, hidden, logit_index):
        return self._head(self._head_inputs, hidden, logit_index)

    def _step(self, tokens, starts, n_past: int, logit_index, n_rows: int, adapters=None, hidden_layers=None):
        """One ``forward_step`` over cache rows 0..n_rows-1 -> (logits, hidden, new K, new V); ``adapters``: the
        rows' LoRA indices as a tensor (LoRA artifacts only). hidden: the final-normed states, or with
        ``hidden_layers`` the inputs of those layers concatenated [n, T, len * hidden]."""
        import torch

        k, v = self._row_views[n_rows]
        self._captured = {} if hidden_layers else None
        try:
            logits, hidden, new_k, new_v = self._model.forward_step(
                tokens, starts, n_past, k, v, logit_index, run_layer=self._run_layer, run_head=self._run_head,
                adapters=adapters)
            if hidden_layers:
                hidden = torch.cat([self._captured[i] for i in hidden_layers], dim=-1)
        finally:
            self._captured = None
        return logits, hidden, new_k, new_v

    def _check_hidden_layers(self, hidden_layers: Sequence[int] | None) -> tuple[int, ...] | None:
        if hidden_layers is None:
            return None
        layers = tuple(int(i) for i in hidden_layers)
        if not layers or not all(0 <= i < len(self._layer_inputs) for i in layers):
            raise ValueError(f"hidden_layers {list(layers)} must name layers in 0..{len(self._layer_inputs) - 1}")
        return layers

    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]],
                adapters: Sequence[int] | None = None, return_hidden: bool = False,
                hidden_layers: Sequence[int] | None = None):
        """Write each prompt's KV into its slot (positions 0..len-1) in one graph call; return float32 logits
        [len(slots), vocab] of each prompt's last token, with ``return_hidden`` also the final-normed hidden states
        [len(slots), longest prompt, hidden] (row i valid up to its prompt's length; what EAGLE drafts read), or with
        ``hidden_layers`` the inputs of those layers concatenated (EAGLE-3's).
        ``adapters``: each prompt's LoRA adapter index (0 or None: the base model). A prompt longer than the largest
        context bucket -> BucketError."""
        import torch

        self._check_prefill(slots, prompts)
        hidden_layers = self._check_hidden_layers(hidden_layers)
        with torch.inference_mode():
            logits, hidden = self._run_prefill(slots, prompts, adapters, hidden_layers)
        return (logits[:, 0], hidden) if return_hidden else logits[:, 0]

    def prompt_logits(self, token_ids: Sequence[int], slot: int = 0, adapter: int = 0) -> torch.Tensor:
        """Teacher-forced float32 logits [len(token_ids), vocab] of every position (row i scores token i+1; the last
        row is what ``prefill`` returns). One graph pass: like ``prefill`` it writes the prompt's KV into ``slot``,
        so decoding can continue from position len(token_ids)."""
        import torch

        self._check_prefill([slot], [token_ids])
        with torch.inference_mode():
            _, hidden = self._run_prefill([slot], [token_ids], [adapter])
            return self._lm_head(hidden[0, : len(token_ids)]).float()

    def _run_prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]], adapters=None,
                     hidden_layers=None):
        """One step for every prompt, right padded to the longest (later steps mask the padding by
        position). The graph reads no cache (every start is 0) and the prompts' KV go to their own rows."""
        import torch

        width = max(len(p) for p in prompts)
        tokens = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long)
        last = torch.tensor([[len(p) - 1] for p in prompts])
        rows = self._rows.rows(slots)
        starts = torch.zeros(len(prompts), dtype=torch.long)
        # Rows 0..n-1 are read, all masked (nothing lies below position 0); the KV goes to the prompts' own rows.
        lora = self._adapter_input(adapters, len(prompts))
        logits, hidden, new_k, new_v = self._step(tokens, starts, 1, last, len(prompts), *lora,
                                                  hidden_layers=hidden_layers)
        self._store(torch.tensor(rows), starts, new_k, new_v)
        for row in rows:
            self._rows.wrote(row, width)
        return logits, hidden

    def decode(self, tokens, positions, slots: Sequence[int] | None = None,
               adapters: Sequence[int] | None = None) -> torch.Tensor:
        """One step for ``slots`` (default: every slot): tokens and positions int64, one per slot, in slot order;
        returns float32 logits [len(slots), vocab] in the same order. Only the given slots run (the graph's
        batch is len(slots)), each attending to its cached positions below its own. ``adapters``: each slot's
        LoRA adapter index (0 or None: the base model)."""
        import torch

        slots = list(range(self.batch_size)) if slots is None else list(slots)
        tokens, positions = self._check_decode(tokens, positions, slots)
        logits, _ = self._run_rows(slots, tokens.view(-1, 1), positions, torch.zeros(len(slots), 1, dtype=torch.long),
                                   adapters)
        return logits[:, 0]

    def verify(self, slots: Sequence[int], token_rows: Sequence[Sequence[int]], starts: Sequence[int],
               return_hidden: bool = False, adapters: Sequence[int] | None = None,
               hidden_layers: Sequence[int] | None = None):
        """Run T tokens per slot in one step (speculative verification): row i's tokens at positions
        ``starts[i]..starts[i]+T-1``; their KV is written. Returns float32 logits [n, T, vocab] (``[i, j]`` scores
        the token after ``token_rows[i][j]``), with ``return_hidden`` also the final-normed hidden states
        [n, T, hidden] (or, with ``hidden_layers``, those layers' inputs concatenated, as ``prefill``). Positions
        past what the caller keeps are harmless: later steps overwrite them.
        ``adapters``: each slot's LoRA adapter index (0 or None: the base model)."""
        import torch

        slots = list(slots)
        width = len(token_rows[0]) if token_rows else 0
        if len(token_rows) != len(slots) or any(len(r) != width for r in token_rows) or width == 0:
            raise ValueError(f"verify needs one non-empty token row per slot, all of one length, got "
                             f"{[len(r) for r in token_rows]} for {len(slots)} slots")
        if width > self.max_verify_tokens:
            raise ValueError(f"verify of {width} tokens per row, but this artifact's step runs at most "
                             f"{self.max_verify_tokens}")
        tokens = torch.tensor([list(r) for r in token_rows], dtype=torch.long)
        positions = torch.as_tensor(list(starts), dtype=torch.long)
        self._check_decode(tokens[:, 0], positions + (width - 1), slots)
        index = torch.arange(width).expand(len(slots), width)  # a broadcast view: the runner makes it contiguous
        logits, hidden = self._run_rows(slots, tokens, positions, index, adapters,
                                        self._check_hidden_layers(hidden_layers))
        return (logits, hidden) if return_hidden else logits

    def _adapter_input(self, adapters: Sequence[int] | None, n: int) -> tuple:
        """The step's adapters argument: () for an artifact without LoRA, else one int64 index per row."""
        import torch

        if adapters is not None:
            adapters = [int(a) for a in adapters]
            if len(adapters) != n:
                raise ValueError(f"{n} rows need {n} adapter indices, got {len(adapters)}")
            if not all(0 <= a <= len(self.adapter_names) for a in adapters):
                raise ValueError(f"adapter indices {adapters} must be in 0..{len(self.adapter_names)} (0: none; "
                                 f"this artifact's adapters: {', '.join(self.adapter_names) or 'none'})")
        if not self._lora:
            return ()
        return (torch.tensor(adapters if adapters is not None else [0] * n, dtype=torch.long),)

    def _run_rows(self, slots: list[int], tokens, starts, logit_index, adapters=None, hidden_layers=None):
        """Pack ``slots`` into rows 0..n-1, run one step over them, store the new KV; outputs in slot order."""
        import torch

        n = len(slots)
        lora = self._adapter_input(adapters, n)
        self._pack(slots)
        rows = self._rows.rows(slots)
        permuted = rows != list(range(n))
        if permuted:  # packed but permuted: feed the graph in row order
            order = torch.tensor(rows)
            tokens = torch.empty_like(tokens).index_copy_(0, order, tokens)
            starts = torch.empty_like(starts).index_copy_(0, order, starts)
            logit_index = torch.empty_like(logit_index).index_copy_(0, order, logit_index)
            lora = tuple(torch.empty_like(a).index_copy_(0, order, a) for a in lora)
        n_past = max(1, int(starts.max()))  # cached positions any row reads (at least 1: a dimension of 0 fails)
        with torch.inference_mode():
            logits, hidden, new_k, new_v = self._step(tokens, starts, n_past, logit_index, n, *lora,
                                                      hidden_layers=hidden_layers)
            self._store(torch.arange(n), starts, new_k, new_v)
        width = tokens.shape[1]
        for row, start in zip(range(n), starts.tolist(), strict=True):
            self._rows.wrote(row, start + width)
        if permuted:
            return logits[rows], hidden[rows]
        return logits, hidden

    def _store(self, rows, starts, new_k, new_v) -> None:
        from neuronpack.models.llama import store_kv

        store_kv(self.k_cache, rows, starts, new_k)
        store_kv(self.v_cache, rows, starts, new_v)

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cache positions of slot ``src`` into slot ``dst`` (parallel sampling shares
        one prefilled prompt)."""
        import torch

        a, b = self._rows.row(src), self._rows.row(dst)
        with torch.inference_mode():
            for cache in (self.k_cache, self.v_cache):
                cache[:, b, :, :length] = cache[:, a, :, :length]
        self._rows.wrote(b, length)

    def _pack(self, slots: list[int]) -> None:
        import torch

        for a, b, length in self._rows.pack(slots):
            with torch.inference_mode():
                for cache in (self.k_cache, self.v_cache):
                    rows = cache[:, [a, b], :, :length]  # a copy of both rows' prefixes
                    cache[:, a, :, :length] = rows[:, 1]
                    cache[:, b, :, :length] = rows[:, 0]

    def _check_prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        if len(slots) != len(prompts) or not slots:
            raise ValueError(f"prefill needs one slot per prompt, got {len(slots)} slots and {len(prompts)} prompts")
        if len(set(slots)) != len(slots) or not all(0 <= s < self.batch_size for s in slots):
            raise ValueError(f"slots {list(slots)} must be distinct and in 0..{self.batch_size - 1}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prefill prompts must not be empty")
        longest = max(len(p) for p in prompts)
        if longest > self.context_buckets[-1]:
            raise BucketError(f"prompt of {longest} tokens exceeds the largest context bucket "
                              f"{self.context_buckets[-1]}", where=f"context buckets {list(self.context_buckets)}",
                              fix="shorten the prompt or compile with a larger max_context_length")

    def _check_decode(self, tokens, positions, slots: list[int]):
        import torch

        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        positions = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
        if not slots or len(set(slots)) != len(slots) or not all(0 <= s < self.batch_size for s in slots):
            raise ValueError(f"decode slots {slots} must be distinct and in 0..{self.batch_size - 1}")
        if tokens.numel() != len(slots) or positions.numel() != len(slots):
            raise ValueError(f"decode needs {len(slots)} tokens and positions (one per slot), got "
                             f"{tokens.numel()} and {positions.numel()}")
        where = positions.tolist()
        if min(where) < 0 or max(where) >= self.max_seq_len:
            raise BucketError(f"position {max(where)} is outside the compiled sequence length "
                              f"{self.max_seq_len}", where=f"token generation buckets "
                              f"{list(self.token_generation_buckets)}",
                              fix="stop the sequence at max_seq_len or compile with a larger seq_len")
        return tokens, positions


def _untouched_zeros(shape: tuple[int, ...], dtype):
    """A zero tensor backed by a private anonymous mapping: pages become resident only when written, so a KV cache
    costs the memory of the positions sequences really reach, not of every slot at full length (torch.zeros writes
    every page). Never written positions are never read unmasked either way."""
    import math
    import mmap

    import torch

    nbytes = max(1, math.prod(shape) * torch.empty((), dtype=dtype).element_size())
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)


def _eos_token_ids(artifact_dir: Path) -> tuple[int, ...]:
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((artifact_dir / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if value is not None:
            return tuple(value) if isinstance(value, list) else (int(value),)
    return ()
