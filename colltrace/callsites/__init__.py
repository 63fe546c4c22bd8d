"""Collective call sites in Python source, read with `ast`: the static checker behind
`colltrace lint`, and the "same kind elsewhere" list attached to a hang finding."""
