"""Signal operators: DFT, STFT, the windows and MelWeightMatrix, with their gradients.
"""
