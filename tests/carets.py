"""Reading an error's caret line: what part of the statement it marks."""


def caret_text(error, source):
    """The part of ``source`` the caret line under it marks."""
    lines = str(error).split("\n")
    caret = lines[lines.index("    " + source) + 1]
    start = len(caret) - len(caret.lstrip(" ")) - 4
    return source[start:start + len(caret.strip())]
