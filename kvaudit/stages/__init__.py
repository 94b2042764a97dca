"""Stages that chain the layers below them into one command: ``kvaudit run`` (and its sequential
form, which runs in blocks and judges each look with the gate's policy: a runner below, the
reports' statistics above, so it lives above both)."""
