"""The one IR shared by the code generators: loop nests (:mod:`einfuse.ir.nodes`), the
typed nodes of ``ef.jit``'s programs (:mod:`einfuse.ir.typed`), and their vocabularies
as enums (:mod:`einfuse.ir.kinds`)."""

from .kinds import (INDEX, BinaryOp, BufferType, ElementOp, FillSource, Function, LoopKind,
                    Policy, QuasiOp, ReduceOp, ScalarType, UnaryOp)
from .nodes import (AccValue, Accumulate, Affine, Binary, Branch, Buffer, Call, CombineLanes,
                    Compensate, Const, DeclareAcc, Expr, Fold, IndexValue, LoopNest, Let, Load,
                    Local, Loop, NormalBranch, Param, LoopProgram, Quasi, SLICE_ROWS, Stmt, Store,
                    Subscript, TiledLoop, Unary, walk)
from .typed import (Apply, Assign, Cast, Index, JitProgram, Read, Reduction, ScatterAdd, Select,
                    Step, Switch, map_reads, node_reads, step_reads, step_writes)

__all__ = ["AccValue", "Accumulate", "Affine", "Apply", "Assign", "Binary", "BinaryOp", "Branch",
           "Buffer", "BufferType", "Call", "Cast", "CombineLanes", "Compensate", "Const",
           "DeclareAcc", "ElementOp", "Expr", "FillSource", "Fold", "Function", "INDEX", "Index",
           "IndexValue", "JitProgram", "LoopNest", "Let", "Load", "Local", "Loop", "LoopKind",
           "NormalBranch", "Param", "Policy", "LoopProgram", "Quasi", "QuasiOp", "Read", "ReduceOp",
           "Reduction", "SLICE_ROWS", "ScalarType", "ScatterAdd", "Select", "Step", "Stmt",
           "Store", "Subscript", "Switch", "TiledLoop", "Unary", "UnaryOp", "map_reads", "node_reads", "step_reads",
           "step_writes", "walk"]
