"""Control flow (If, Loop, Scan, SequenceMap), sequences and optionals, with the gradients of
If, Loop and Scan.
"""
