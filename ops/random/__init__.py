"""Random operators: RandomNormal, RandomUniform (and their Like forms), Bernoulli,
Multinomial; MXNet's samplers (``mixrt::Sample*``, RandomInteger, SampleMultinomial,
Shuffle: ``samplers.py``) and densities (RandomPdf: ``pdf.py``).
"""
