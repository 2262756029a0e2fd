# SPDX-License-Identifier: MIT
"""The state arguments of a context-parallel forward (``initial_state``, ``final_state``,
``ssm_state_indices``, ``has_initial_state``) as its phases read and write them, one plan
row at a time or as the arguments of one local ``flash_kda.fwd`` call.

Checked when built, with the rules of ``flash_kda.fwd`` (design §1.4, §10), so that no
later call can reject them after a phase has written something. Device index tensors are
never read on the host: single rows are gathered and scattered with masks, and indices
>= P count as padding as on the native path.
"""

from typing import Optional

import torch

D = 128
MAX_POOL = 2**30
_STATE_DTYPES = (torch.bfloat16, torch.float32)


def _span(x: torch.Tensor) -> tuple:
    """[first, last + 1) byte addresses of a contiguous tensor."""
    return x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()


def _meets(a: tuple, b: tuple) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _reach(x: torch.Tensor) -> tuple:
    """[first, last + 1) byte addresses of a strided view with non-negative strides."""
    high = sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
    return x.data_ptr(), x.data_ptr() + (high + 1) * x.element_size()


class States:
    """Row i of a plan reads ``initial_state[i]`` and writes ``final_state[i]``, or pool slot
    ``ssm_state_indices[i]`` (negative or >= P: padding, zero start, nothing written);
    ``has_initial_state[i]`` False starts it from zero."""

    def __init__(self, where: str, initial, final, indices, has_initial, rows: int, heads: int, out: torch.Tensor):
        self.where, self.device = where, out.device
        self.initial, self.final, self.indices, self.has_initial = initial, final, indices, has_initial
        states = [(n, x) for n, x in (("initial_state", initial), ("final_state", final)) if x is not None]
        for name, x in states:
            self._tensor(name, x, _STATE_DTYPES, "bfloat16 or float32")
        if len(states) == 2 and initial.dtype != final.dtype:
            raise TypeError(
                f"{where}: initial_state and final_state must have the same dtype, "
                f"got {initial.dtype} and {final.dtype}"
            )
        if indices is not None:
            self._tensor("ssm_state_indices", indices, (torch.int32, torch.int64), "int32 or int64")
            self._rows("ssm_state_indices", indices, rows)
            if not states:
                raise ValueError(f"{where}: ssm_state_indices needs initial_state or final_state (the state pools)")
        if has_initial is not None:
            self._tensor("has_initial_state", has_initial, (torch.bool,), "bool")
            self._rows("has_initial_state", has_initial, rows)
        self.pool = states[0][1].shape[0] if states and states[0][1].dim() == 4 else 0
        if indices is None:
            self.pool = rows
        elif not 1 <= self.pool <= MAX_POOL:
            raise ValueError(
                f"{where}: the state pools must have shape [P, H, V, K] with P in [1, 2**30], "
                f"got {list(states[0][1].shape)}"
            )
        form = "[N, H, V, K]" if indices is None else "[P, H, V, K]"
        for name, x in states:
            if list(x.shape) != [self.pool, heads, D, D]:
                expected = [self.pool, heads, D, D]
                raise ValueError(f"{where}: {name} must have shape {form} = {expected}, got {list(x.shape)}")
            if not x.is_contiguous() or x.data_ptr() % 16:
                raise ValueError(f"{where}: {name} must be contiguous and 16-byte aligned")
        if indices is not None and indices.device.type == "cpu":
            self._check_slots(indices.tolist())
        self._check_writable(out)

    def _tensor(self, name: str, x, dtypes, expected: str) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.where}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in dtypes:
            raise TypeError(f"{self.where}: {name} must be {expected}, got {x.dtype}")
        if x.device != self.device:
            raise ValueError(f"{self.where}: {name} must be on {self.device} like q, got {x.device}")
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError(f"{self.where}: {name} requires grad, but the forward is forward-only (no backward)")

    def _rows(self, name: str, x: torch.Tensor, rows: int) -> None:
        if x.dim() != 1 or x.numel() != rows:
            raise ValueError(f"{self.where}: {name} must have shape [N] = [{rows}], got {list(x.shape)}")

    def _check_slots(self, slots: list) -> None:
        seen = {}
        for i, slot in enumerate(slots):
            if slot >= self.pool:
                raise ValueError(
                    f"{self.where}: ssm_state_indices must be < the pool size P = {self.pool} (or negative for "
                    f"padding), got ssm_state_indices[{i}] = {slot}"
                )
            if slot >= 0 and slot in seen:
                raise ValueError(
                    f"{self.where}: ssm_state_indices must not repeat a slot, got ssm_state_indices[{seen[slot]}] = "
                    f"ssm_state_indices[{i}] = {slot}"
                )
            seen[slot] = i

    def _check_writable(self, out: torch.Tensor) -> None:
        final = self.final
        if final is None:
            return
        if final.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(
                f"{self.where}: final_state is an inference tensor and cannot be written outside inference mode"
            )
        if self.initial is not None and final is not self.initial and _meets(_span(final), _span(self.initial)):
            raise ValueError(
                f"{self.where}: final_state must not overlap initial_state in memory; "
                "it may only be initial_state itself"
            )
        if out.numel() and _meets(_span(final), _reach(out)):
            raise ValueError(f"{self.where}: final_state must not overlap out in memory")

    # ------------------------------------------------------------------ one row

    def _slot(self, row: int):
        """(slot tensor [1] on the device, valid mask [1]) of a pooled row."""
        slot = self.indices[row : row + 1].to(self.device).long()
        return slot.clamp(0, self.pool - 1), (slot >= 0) & (slot < self.pool)

    def start(self, row: int) -> Optional[torch.Tensor]:
        """fp32 [1, H, 128, 128]: the row's start state (bf16-exact for a bf16 state), or None
        when there is no initial_state (every row starts from zero)."""
        if self.initial is None:
            return None
        keep = None
        if self.indices is None:
            state = self.initial[row : row + 1].float()
        else:
            slot, keep = self._slot(row)
            state = self.initial.index_select(0, slot).float()
        if self.has_initial is not None:
            has = self.has_initial[row : row + 1]
            keep = has if keep is None else keep & has
        if keep is not None:
            state = torch.where(keep.view(1, 1, 1, 1), state, torch.zeros((), dtype=state.dtype, device=self.device))
        return state

    def store(self, row: int, state: torch.Tensor) -> None:
        """Write the row's end state (fp32 [1, H, 128, 128]) in final_state's dtype."""
        if self.final is None:
            return
        if self.indices is None:
            self.final[row : row + 1].copy_(state)
            return
        slot, valid = self._slot(row)
        kept = self.final.index_select(0, slot)
        self.final.index_copy_(0, slot, torch.where(valid.view(1, 1, 1, 1), state.to(self.final.dtype), kept))

    def store_empty(self, row: int) -> None:
        """An empty sequence: its final state is its start state rounded to bf16 (design §1.3)."""
        if self.final is None:
            return
        start = self.start(row)
        if start is None:
            start = torch.zeros(1, *self.final.shape[1:], dtype=torch.float32, device=self.device)
        self.store(row, start.to(torch.bfloat16).float())

    # ------------------------------------------------------------------ many rows

    def call_args(self, row0: int, row1: int) -> dict:
        """The state keywords of one ``flash_kda.fwd`` call over rows [row0, row1)."""
        args = {}
        if self.indices is None:
            if self.initial is not None:
                args["initial_state"] = self.initial[row0:row1]
            if self.final is not None:
                in_place = self.final is self.initial
                args["final_state"] = args["initial_state"] if in_place else self.final[row0:row1]
        else:
            args.update(initial_state=self.initial, final_state=self.final, ssm_state_indices=self.indices[row0:row1])
        if self.has_initial is not None:
            args["has_initial_state"] = self.has_initial[row0:row1]
        return args
