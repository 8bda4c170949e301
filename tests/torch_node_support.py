"""Shared by the C++ autograd node's tests (the built node is conftest.py's ``node``
fixture): whether a program's calls took the node, and turning it off for a program
(its Python autograd path, the reference the node's bits are checked against)."""


def uses_node(program) -> bool:
    return any(call._node is not None for owner in program._autograd.values()
               for call in owner.calls.values())


def python_path(program) -> None:
    for owner in program._autograd.values():
        for call in owner.calls.values():
            call._node, call._node_tried = None, True
