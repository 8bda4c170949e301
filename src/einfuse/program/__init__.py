"""Programs: several statements compiled and run as one computation (programs.md §1)."""

from .program import Program, ProgramStatement, compile_program, is_program
from .split import StatementText, split_program

__all__ = ["Program", "ProgramStatement", "StatementText", "compile_program", "is_program",
           "split_program"]
