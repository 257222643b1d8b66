"""Recurrent layers: RNN, GRU and LSTM, their expansions and gradients, and the CPU paths
that run a whole sequence in compiled calls.
"""
