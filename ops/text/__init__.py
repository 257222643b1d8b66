"""Text: the string operators, TfIdfVectorizer, onnxruntime's Tokenizer and the RE2 patterns
they search with.
"""
