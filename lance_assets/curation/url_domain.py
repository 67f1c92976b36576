"""The host and the registered domain of a document's ``url``, for a whole column at once.

The registered domain is the name a person registered: ``news.example.co.uk`` -> ``example.co.uk``,
``www.example.com`` -> ``example.com``. Without a copy of the Public Suffix List (none is
installed, and nothing here is fetched) it follows one documented rule: the last two labels of
the host, or the last three when the last is a two-letter country code and the one before it is
a common second-level label (``co``, ``com``, ``org``, ``net``, ``ac``, ``gov``, ``edu``, ``ne``,
``or``, ``go``, ``gob``, ``nic``, ``mil``, ``ltd``, ``plc``, ``sch``: ``example.co.uk``,
``example.com.au``). An IP address, ``localhost`` and a one-label host are their own domain. A
suffix the rule does not know (``github.io``, ``blogspot.com``) groups its sites under it.

The host is taken with one vectorised regular expression over the column; the rule runs once per
distinct host, so a million urls cost one pass and a dictionary the size of the host set.
"""

from __future__ import annotations

import ipaddress

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SECOND_LEVEL = frozenset({"co", "com", "org", "net", "ac", "gov", "edu", "ne", "or", "go", "gob",
                          "nic", "mil", "ltd", "plc", "sch"})
# scheme://[userinfo@]host[:port]: the host, lowercased afterwards
HOST_RE = r"^[A-Za-z][A-Za-z0-9+.-]*://(?:[^/?#@]*@)?(?P<host>\[[^\]]*\]|[^/?#:]*)"
UNKNOWN = ""  # no url, or a url without a host


def registered_domain(host: str) -> str:
    """``host``'s registered domain by the rule of the module docstring."""
    host = host.strip().strip(".").lower()
    if host.startswith("[") or not host:
        return host
    if host[-1].isdigit():  # an IPv4 address is its own domain (no top-level domain is numeric)
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            pass
    labels = host.split(".")
    if len(labels) <= 2:
        return host
    if len(labels[-1]) == 2 and labels[-2] in SECOND_LEVEL:
        return ".".join(labels[-3:])
    return ".".join(labels[-2:])


def hosts(urls: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The lowercased host of each url ('' where there is none)."""
    if isinstance(urls, pa.ChunkedArray):
        urls = urls.combine_chunks() if urls.num_chunks else pa.array([], pa.string())
    if pa.types.is_dictionary(urls.type):
        urls = urls.cast(urls.type.value_type)
    found = pc.extract_regex(pc.fill_null(urls, ""), HOST_RE)
    got = pc.struct_field(found, [0])
    return pc.utf8_lower(pc.fill_null(got, UNKNOWN))


def domain_codes(urls: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """``(codes, names)``: each url's registered domain as an index into ``names`` (sorted,
    '' for rows without a host)."""
    host_arr = hosts(urls)
    encoded = pc.dictionary_encode(host_arr)
    host_names = encoded.dictionary.to_pylist()
    host_codes = encoded.indices.to_numpy(zero_copy_only=False)
    domains = [registered_domain(h) if h else UNKNOWN for h in host_names]
    names = sorted(set(domains))
    index = {n: i for i, n in enumerate(names)}
    of_host = np.array([index[d] for d in domains], dtype=np.int64)
    codes = of_host[host_codes] if len(host_codes) else np.zeros(0, np.int64)
    return codes.astype(np.int64), names
