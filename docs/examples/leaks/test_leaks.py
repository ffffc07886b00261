import torch

_TABLE = {}      # a cache: filled on first use, the same keys serve later tests
_SEEN = []       # a leak: grows with every test that appends to it


def table(n):
    if n not in _TABLE:
        _TABLE[n] = torch.ones(n)
    return _TABLE[n]


def test_first_user_of_the_table():
    table(1024).sum()


def test_second_user_of_the_table():
    table(1024).sum()


def test_appends():
    _SEEN.append(torch.ones(1024))


def test_appends_too():
    _SEEN.append(torch.ones(2048))
