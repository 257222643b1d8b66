"""Random operators: RandomNormal, RandomUniform (and their Like forms), Bernoulli,
Multinomial.
"""
