"""The gradient of a program is a program (programs.md section 1): reverse mode over
the statement DAG.

For each statement, last to first, the gradient of what it defines (``dN``, the sum
of every later statement's contribution, plus the caller's seed where ``N`` is an
output) is pushed to each name it reads that depends on ``wrt``: the statement's own
v1 gradient statements (derive.py) with ``dN`` as their output gradient.  Statements
that do not lead from ``wrt`` to an output contribute nothing and are left out.

The backward statements read the forward's intermediates, so the gradient program
recomputes the forward program first (``forward``), then runs the steps in order,
adding the contributions to each ``d<name>`` as they come.  No text is parsed twice
on the way: the steps are the v1 gradient statements, each runnable with ``ef.ein``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..lang.parser import parse
from ..autodiff.program_steps import (depends_on, gradient_prefix, reaching_outputs,
                                      statement_options, value_names)
from ..autodiff.derive import GradientStatement, NoGradientError, derive
from .compile import compile_source


@dataclass(frozen=True)
class GradientStep:
    """The gradients one forward statement passes on: for each name it reads that
    depends on ``wrt``, the statements computing that name's share (their ``target``)
    from the statement's output gradient ``seed``."""
    statement: str
    seed: str
    parts: Tuple[Tuple[str, Tuple[GradientStatement, ...]], ...]


@dataclass(frozen=True)
class ProgramGradient:
    """``d<wrt>`` of a program, as a program: the forward statements (recomputed), then
    the backward steps.  The caller passes the program's inputs and one output gradient
    per output (``seeds``: ``d<output>``, with the output's shape)."""
    source: str
    wrt: str
    result: str
    forward: Tuple[str, ...]
    outputs: Tuple[str, ...]
    seeds: Tuple[str, ...]
    steps: Tuple[GradientStep, ...]
    # the program's ranges/pad/bounds/fill: the recomputed forward needs them too
    options: Dict[str, object] = field(default_factory=dict)

    @property
    def statements(self) -> Tuple[GradientStatement, ...]:
        return tuple(g for step in self.steps for _, grads in step.parts for g in grads)

    def __str__(self) -> str:
        lines = ["# forward, recomputed: the backward reads its intermediates"]
        lines += self.forward
        lines.append(f"# backward: given {', '.join(self.seeds)}; contributions to the "
                     "same name add up")
        for step in self.steps:
            lines.append(f"# through {step.statement}")
            for _, grads in step.parts:
                lines += [f"{g}" if g.kind == "gather" else f"{g}   (scatter-add)"
                          for g in grads]
        return "\n".join(lines)

    def run(self, arrays: Mapping[str, object], backend: str = "numpy"):
        """``d<wrt>`` for the program's inputs and the output gradients in ``arrays``."""
        from ..runtime.gradient_reference import run_reference
        defined = [parse(text).output for text in self.forward]
        program = compile_source("\n".join(self.forward), outputs=defined, backend=backend,
                             **self.options)
        missing = [name for name in program.inputs + self.seeds if name not in arrays]
        if missing:
            raise NoGradientError(f"the gradient program needs {', '.join(missing)} (the "
                                  f"program's inputs, and one output gradient per output "
                                  f"{', '.join(self.outputs)})")
        env = {name: arrays[name] for name in program.inputs + self.seeds}
        values = program(**{name: env[name] for name in program.inputs})
        env.update(zip(defined, values if len(defined) > 1 else (values,)))
        for step in self.steps:
            for _, grads in step.parts:
                for target, value in run_reference(grads, env, backend=backend).items():
                    # a seed or an earlier contribution is there already: they add up
                    env[target] = env[target] + value if target in env else value
        return env[self.result]


def derive_program(source: str, wrt: str, options: Optional[Dict[str, object]] = None,
                   outputs: Optional[Sequence[str]] = None) -> ProgramGradient:
    """The gradient program of ``source`` with respect to input ``wrt``.  The program is
    compiled first: its checks (names defined once, read after their definition,
    ``outputs=`` naming defined tensors) and its choice of outputs are the gradient's."""
    options = dict(options or {})
    given = {k: options[k] for k in ("ranges", "pad", "bounds", "fill")
             if options.get(k) is not None}
    program = compile_source(source, outputs=outputs, backend="numpy", **given)
    pieces = [statement.source for statement in program.statements]
    specs = [statement.kernel.spec for statement in program.statements]
    for spec, piece in zip(specs, pieces):
        if spec.assign != ":=":
            raise NoGradientError(
                f"gradients of programs with '{spec.assign}' statements are not built; "
                "define each name with ':='", source=piece.text,
                span=spec.statement.output_span)
    defined = [spec.output for spec in specs]
    if wrt in defined:
        raise NoGradientError(f"{wrt} is computed by the program; ask for the gradient of "
                              "one of its inputs")
    chosen = program.outputs
    prefix = gradient_prefix(specs)
    depends = depends_on(specs, wrt)
    if not any(depends.get(name) for name in chosen):
        raise NoGradientError(f"no output of the program ({', '.join(chosen)}) depends on "
                              f"{wrt}")
    reaching = reaching_outputs(specs, chosen)
    steps: List[GradientStep] = []
    for spec, piece in reversed(list(zip(specs, pieces))):
        out = spec.output
        if not depends.get(out) or out not in reaching:
            continue
        parts = []
        for name in value_names(spec):
            if name != wrt and not depends.get(name):
                continue
            own = statement_options(options, spec)
            grads = derive(piece.text, name, output_grad_name=prefix + out, options=own)
            grads = [dataclasses.replace(g, target=prefix + name) for g in grads]
            parts.append((name, tuple(grads)))
        steps.append(GradientStep(piece.text, prefix + out, tuple(parts)))
    return ProgramGradient(source, wrt, prefix + wrt, tuple(p.text for p in pieces), chosen,
                           tuple(prefix + name for name in chosen), tuple(steps), given)


__all__ = ["ProgramGradient", "GradientStep", "derive_program"]
