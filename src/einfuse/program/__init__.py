"""Programs: several statements compiled and run as one computation (programs.md §1)."""

from .program import Program, ProgramStatement, compile_program, is_program

__all__ = ["Program", "ProgramStatement", "compile_program", "is_program"]
