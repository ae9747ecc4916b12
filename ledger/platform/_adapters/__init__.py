"""The only modules that touch a library's internals: one per library, each saying what it
uses, why the public way was not taken (the measurement), and which test fails loudly when
the library changes (tests/test_private_apis.py). docs/adr/0004-private-framework-apis.md
gives the rule; everything else in the service uses public APIs only.
"""
