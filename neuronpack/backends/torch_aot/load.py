"""Load a portable artifact and run it: the runtime-facing ``CompiledLM``.

Weights are read once from ``weights/`` into the model and passed to the compiled layer and head graphs as inputs on
every call (no copy), from one huge-page arena (models/weight_arena.py); with ``linear_kernels`` the graphs' linears
call neuronpack's decode kernels, registered first from the artifact's own ``neuronpack_kernels.so`` copy
(models/linear_kernels.py). The KV cache (kv_cache.py: one K and one V tensor
``[layers, batch_size, kv_heads, seq_len + 1, head_dim]``) is owned here: the layer graphs read it and return the
K/V of the tokens they ran, which ``KvCache.store`` writes at their positions. The artifact's configuration is an
``ArtifactConfig`` (artifact_config.py); the checks of each call's arguments are ``StepBounds`` (step_inputs.py).

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
from typing import TYPE_CHECKING

from neuronpack.backends.torch_aot import layout as L
from neuronpack.backends.torch_aot.artifact_config import ArtifactConfig, read_artifact_config
from neuronpack.backends.torch_aot.kv_cache import KvCache
from neuronpack.backends.torch_aot.layout import GRAPHS_FILE, WEIGHTS_DIR
from neuronpack.backends.torch_aot.lora import attach_artifact_lora
from neuronpack.backends.torch_aot.runners import load_runners
from neuronpack.backends.torch_aot.step_inputs import StepBounds
from neuronpack.backends.torch_aot.validate import check_device, check_loadable
from neuronpack.progress import NullReporter, Reporter

if TYPE_CHECKING:
    import torch


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
    config = read_artifact_config(artifact_dir)
    check_device(artifact_dir, config.target, device)
    check_loadable(artifact_dir, config.target)
    model = load_model(open_checkpoint(artifact_dir / WEIGHTS_DIR), getattr(torch, config.torch_dtype),
                       max_seq_len=config.seq_len, reporter=reporter)
    attach_artifact_lora(model, config.lora, artifact_dir)  # the lora_A / lora_B stacks, from lora/<name>/
    move_to_arena(model)  # huge pages: a decode step streams every weight (models/weight_arena.py)
    if config.kernels:  # before the graphs load: they call the kernels' ops by name
        from neuronpack.models.linear_kernels import use_kernels

        use_kernels(model, library=artifact_dir / L.KERNELS_LIBRARY)  # refuses an artifact without its copy
    with reporter.task(f"load graphs ({config.compiler})", total=len(config.graphs)) as task:
        runners = load_runners(artifact_dir / GRAPHS_FILE, config, task)
    return CompiledLM(config, model, runners, _eos_token_ids(artifact_dir))


class CompiledLM:
    """The loaded model, its compiled graphs and the KV cache they share (kv_cache.py). A slot is a cache row: the
    runtime's RowAllocator keeps a step's rows packed into rows 0..n-1, so a step over n rows runs at batch n.

    A step is ``CausalLM.forward_step`` (models/decoder.py) of the loaded model (its embedding, rotary tables and
    masks run eagerly: a few small ops) with the compiled layer and head graphs in place of its modules."""

    def __init__(self, config: ArtifactConfig, model, runners: dict[str, Callable], eos: tuple[int, ...]):
        import torch

        from neuronpack.backends.torch_aot.graphs import head_weights, layer_weights

        self.config = config
        self.batch_size: int = config.batch_size
        self.context_buckets: tuple[int, ...] = config.context_encoding_buckets
        self.token_generation_buckets: tuple[int, ...] = config.token_generation_buckets
        self.max_seq_len: int = config.seq_len
        self.num_layers: int = config.num_layers
        self.vocab_size: int = config.vocab_size
        self.eos_token_ids: tuple[int, ...] = eos
        self.compiler: str = config.compiler
        self.dtype = getattr(torch, config.torch_dtype)
        # Tokens per row one verify step may run (the longest prompt, at least speculation length + 1).
        self.max_verify_tokens: int = config.max_step_tokens
        # LoRA: adapter index k (1-based) is adapter_names[k - 1]; a LoRA artifact's graph takes one index per row
        self.adapter_names: tuple[str, ...] = config.adapter_names
        self._check = StepBounds.for_config(config)
        self._model = model  # its tensors are the graphs' weight inputs (AOTInductor holds no copy)
        model.use_position_tables(config.kv_cache_positions)  # every position a step can reach
        suffix = [f".{g}" if g else "" for g in config.layer_graphs]
        self._layer_graphs = [(runners[L.LAYER_DECODE + s], runners[L.LAYER_STEP + s]) for s in suffix]
        self._layer_inputs = [layer_weights(model, i) for i in range(len(suffix))]
        self._head = runners[L.HEAD]
        self._draft_runners = {name: runners[name] for name in L.DRAFT_GRAPHS if name in runners}
        self._head_inputs = head_weights(model)
        cfg = model.config  # sliding-window layers keep a ring of positions when the artifact says so (kv_ring)
        self._cache = KvCache.for_config(config, [i for i in range(cfg.num_layers)
                                                  if cfg.window(cfg.layer_kind(i)) is not None])
        # The positions a ringed layer attends to (the engine reuses a cached prefix only where a ring keeps it)
        self.kv_window: int | None = cfg.sliding_window if config.kv_ring else None
        self._lora = config.lora is not None

    def draft_graphs(self, draft):
        """The artifact's compiled EAGLE draft graphs bound to ``draft`` (loaded from its ``draft/``), or None
        when the artifact has none (the draft then runs eagerly)."""
        if not self._draft_runners:
            return None
        from neuronpack.backends.torch_aot.draft_graphs import CompiledDraft

        return CompiledDraft(self._draft_runners, draft, self.max_verify_tokens, kernels=self.config.kernels)

    @property
    def kv_row_bytes(self) -> int:
        """Bytes of one KV-cache row (every layer, K and V, every position)."""
        return self._cache.row_bytes

    @property
    def kv_token_bytes(self) -> int:
        """Bytes of one position of a KV-cache row (every layer, K and V): a prefix-cache block's is this x its
        positions."""
        return self._cache.token_bytes

    def reserve_blocks(self, blocks: int, block_size: int) -> None:
        """A pool of ``blocks`` KV blocks of ``block_size`` positions beyond the rows: the runtime's prefix cache
        keeps prefixes there, reached by ``move_kv`` only (never run by a step)."""
        self._cache.reserve_blocks(blocks, block_size)

    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]],
                adapters: Sequence[int] | None = None, starts: Sequence[int] | None = None) -> torch.Tensor:
        """Write each prompt's KV into its slot (positions 0..len-1) in one graph call; return float32 logits
        [len(slots), vocab] of each prompt's last token. ``adapters``: each prompt's LoRA adapter index (0 or None:
        the base model). ``starts``: each prompt's first position (prefix caching, a chunk of a long prompt): its
        tokens go at positions start.. and attend to the slot's cached positions below. A prompt longer than the
        largest context bucket -> BucketError."""
        return self._prefill(slots, prompts, adapters, None, starts)[0]

    def prefill_hidden(self, slots: Sequence[int], prompts: Sequence[Sequence[int]],
                       hidden_layers: Sequence[int] | None = None, starts: Sequence[int] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """``prefill`` that also returns hidden states: (logits [len(slots), vocab], hidden [len(slots), longest
        prompt, hidden]), row i valid up to its prompt's length (what EAGLE drafts read): the final-normed states,
        or with ``hidden_layers`` the inputs of those layers concatenated (EAGLE-3's)."""
        return self._prefill(slots, prompts, None, self._check.hidden_layers(hidden_layers), starts)

    def _prefill(self, slots, prompts, adapters, hidden_layers, starts=None) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        self._check.prefill(slots, prompts, starts)
        with torch.inference_mode():
            logits, hidden = self._run_prefill(slots, prompts, adapters, hidden_layers, starts)
        return logits[:, 0], hidden

    def prompt_logits(self, token_ids: Sequence[int], slot: int = 0, adapter: int = 0, start: int = 0
                      ) -> torch.Tensor:
        """Teacher-forced float32 logits [len(token_ids), vocab] of every position (row i scores token i+1; the last
        row is what ``prefill`` returns). One graph pass: like ``prefill`` it writes the prompt's KV into ``slot``,
        so decoding can continue from position len(token_ids). ``start``: the tokens' first position (a chunk of
        a long prompt, after the chunks before it)."""
        import torch

        self._check.prefill([slot], [token_ids], [start])
        with torch.inference_mode():
            _, hidden = self._run_prefill([slot], [token_ids], [adapter], starts=[start])
            return self._model.logits(hidden[0, : len(token_ids)])

    def decode(self, tokens, positions, slots: Sequence[int] | None = None,
               adapters: Sequence[int] | None = None) -> torch.Tensor:
        """One step for ``slots`` (default: every slot): tokens and positions int64, one per slot, in slot order;
        returns float32 logits [len(slots), vocab] in the same order. Only the given slots run (the graph's
        batch is len(slots)), each attending to its cached positions below its own. ``adapters``: each slot's
        LoRA adapter index (0 or None: the base model)."""
        import torch

        slots = list(range(self.batch_size)) if slots is None else list(slots)
        tokens, positions = self._check.decode(tokens, positions, slots)
        logits, _ = self._run_rows(slots, tokens.view(-1, 1), positions, torch.zeros(len(slots), 1, dtype=torch.long),
                                   adapters)
        return logits[:, 0]

    def verify(self, slots: Sequence[int], token_rows: Sequence[Sequence[int]], starts: Sequence[int],
               adapters: Sequence[int] | None = None) -> torch.Tensor:
        """Run T tokens per slot in one step (speculative verification): row i's tokens at positions
        ``starts[i]..starts[i]+T-1``; their KV is written. Returns float32 logits [n, T, vocab] (``[i, j]`` scores
        the token after ``token_rows[i][j]``). Positions past what the caller keeps are harmless: later steps
        overwrite them. ``adapters``: each slot's LoRA adapter index (0 or None: the base model)."""
        return self._verify(slots, token_rows, starts, adapters, None)[0]

    def verify_hidden(self, slots: Sequence[int], token_rows: Sequence[Sequence[int]], starts: Sequence[int],
                      hidden_layers: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``verify`` that also returns hidden states: (logits [n, T, vocab], hidden [n, T, hidden]), the
        final-normed states or, with ``hidden_layers``, those layers' inputs concatenated (as ``prefill_hidden``)."""
        return self._verify(slots, token_rows, starts, None, self._check.hidden_layers(hidden_layers))

    def _verify(self, slots, token_rows, starts, adapters, hidden_layers) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        slots = list(slots)
        tokens, positions = self._check.verify(slots, token_rows, starts)
        n, width = tokens.shape
        if self.kv_window is not None and width - 1 > self._cache.ring - self.kv_window:
            # what a verify step writes past what it keeps must stay outside every later window (kv_cache.py)
            raise ValueError(f"verify of {width} tokens per row: this artifact's sliding-window rings keep room for "
                             f"{self._cache.ring - self.kv_window} drafts (its speculation length)")
        index = torch.arange(width).expand(n, width)  # a broadcast view: the runner makes it contiguous
        return self._run_rows(slots, tokens, positions, index, adapters, hidden_layers)

    def copy_rows(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Apply ``(src, dst, length)`` copies in order: cache positions 0..length-1 of row src into row dst (the
        runtime's row moves and parallel sampling's shared prompt, runtime/engine/kv_rows.py)."""
        self._cache.copy_rows(copies)

    def move_kv(self, moves: Sequence) -> None:
        """Apply the runtime's KV moves in order: row copies, row swaps, block copies to or from the prefix pool
        and exchanges (runtime/engine/kv_rows.py ``RowCopy``, ``RowSwap``, ``BlockCopy``, ``BlockExchange``)."""
        self._cache.move(moves)

    # -- one step over cache rows -------------------------------------------------------------------------------
    def _run_prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]], adapters=None,
                     hidden_layers=None, starts: Sequence[int] | None = None):
        """One step for every prompt, right padded to the longest (later steps mask the padding by
        position). From position 0 the graph reads no cache and the prompts' KV go to their own rows; from later
        starts it is a step over the slots' rows (``_run_rows``), attending to what they hold below their start."""
        import torch

        width = max(len(p) for p in prompts)
        tokens = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long)
        last = torch.tensor([[len(p) - 1] for p in prompts])
        if starts is not None and any(starts):
            return self._run_rows(list(slots), tokens, torch.tensor(list(starts), dtype=torch.long), last, adapters,
                                  hidden_layers, [len(p) for p in prompts])
        starts = torch.zeros(len(prompts), dtype=torch.long)
        # Rows 0..n-1 are read, all masked (nothing lies below position 0); the KV goes to the prompts' own rows.
        lora = self._adapter_input(adapters, len(prompts))
        logits, hidden, new_k, new_v = self._step(tokens, starts, 1, last, self._cache.views(len(prompts)), *lora,
                                                  hidden_layers=hidden_layers)
        self._cache.store(torch.tensor(list(slots)), starts, new_k, new_v, [len(p) for p in prompts])
        return logits, hidden

    def _run_rows(self, slots: list[int], tokens, starts, logit_index, adapters=None, hidden_layers=None,
                  lengths: Sequence[int] | None = None):
        """One step over cache rows ``slots``, the new KV stored; outputs in the order of ``slots``. Rows 0..n-1
        (the runtime's, packed by its RowAllocator) run on views of the cache, in any order; other rows on copies.
        ``lengths``: each row's valid tokens (right-padded prompts; None: every token)."""
        import torch

        n = len(slots)
        lora = self._adapter_input(adapters, n)
        first = min(slots)
        packed = sorted(slots) == list(range(first, first + n))  # one contiguous span of rows: views, no copy
        permuted = packed and slots != list(range(first, first + n))
        if permuted:  # packed but permuted: feed the graph in row order
            order = torch.tensor(slots) - first
            tokens = torch.empty_like(tokens).index_copy_(0, order, tokens)
            starts = torch.empty_like(starts).index_copy_(0, order, starts)
            logit_index = torch.empty_like(logit_index).index_copy_(0, order, logit_index)
            lora = tuple(torch.empty_like(a).index_copy_(0, order, a) for a in lora)
        n_past = max(1, int(starts.max()))  # cached positions any row reads (at least 1: a dimension of 0 fails)
        with torch.inference_mode():
            caches = self._cache.span(first, n) if packed else self._cache.gathered(slots)
            logits, hidden, new_k, new_v = self._step(tokens, starts, n_past, logit_index, caches, *lora,
                                                      hidden_layers=hidden_layers)
            rows = torch.arange(first, first + n) if packed else torch.tensor(slots)
            in_rows = None if lengths is None else [lengths[slots.index(r)] for r in rows.tolist()]  # rows' order
            self._cache.store(rows, starts, new_k, new_v, in_rows)
        if permuted:
            index = [s - first for s in slots]
            return logits[index], hidden[index]
        return logits, hidden

    def _adapter_input(self, adapters: Sequence[int] | None, n: int) -> tuple:
        """The step's adapters argument: () for an artifact without LoRA, else one int64 index per row."""
        import torch

        adapters = self._check.adapters(adapters, n)
        if not self._lora:
            return ()
        return (torch.tensor(adapters if adapters is not None else [0] * n, dtype=torch.long),)

    def _step(self, tokens, starts, n_past: int, logit_index, caches, adapters=None, hidden_layers=None):
        """One ``forward_step`` over ``caches`` (per-layer K and V of the step's rows) -> (logits, hidden, new K,
        new V); ``adapters``: the rows' LoRA indices as a tensor (LoRA artifacts only). hidden: the final-normed
        states, or with ``hidden_layers`` the inputs of those layers concatenated [n, T, len * hidden]."""
        import torch

        k, v = caches
        inputs: dict[int, torch.Tensor] = {}  # with hidden_layers: layer -> the residual stream entering it
        run_layer = self._run_layer if not hidden_layers else self._capturing(inputs)
        logits, hidden, new_k, new_v = self._model.forward_step(
            tokens, starts, n_past, k, v, logit_index, run_layer=run_layer, run_head=self._run_head, adapters=adapters,
            ring=self._cache.ring)
        if hidden_layers:
            hidden = torch.cat([inputs[i] for i in hidden_layers], dim=-1)
        return logits, hidden, new_k, new_v

    def _capturing(self, inputs: dict):
        """``_run_layer`` that also records each layer's input in ``inputs`` (EAGLE-3 reads three of them)."""
        def run_layer(i: int, x, *args):
            inputs[i] = x
            return self._run_layer(i, x, *args)

        return run_layer

    def _run_layer(self, i: int, x, cos, sin, masks, k_rows, v_rows, *lora):
        decode, step = self._layer_graphs[i]
        graph = decode if x.shape[1] == 1 else step
        return graph(self._layer_inputs[i], x, cos, sin, masks.past, k_rows, v_rows, *lora)

    def _run_head(self, hidden, logit_index):
        return self._head(self._head_inputs, hidden, logit_index)


def _eos_token_ids(artifact_dir: Path) -> tuple[int, ...]:
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((artifact_dir / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if value is not None:
            return tuple(value) if isinstance(value, list) else (int(value),)
    return ()
