-- Tokens per document in power-of-two buckets, and each bucket's share of all tokens.
SELECT
    CASE WHEN n_tokens IS NULL THEN 'not tokenized'
         WHEN n_tokens = 0 THEN '0'
         ELSE (2 ** floor(log2(n_tokens)))::BIGINT || '..' || (2 ** (floor(log2(n_tokens)) + 1) - 1)::BIGINT
    END                                             AS tokens,
    count(*)                                        AS rows,
    sum(n_tokens)                                   AS total_tokens,
    round(sum(n_tokens) / sum(sum(n_tokens)) OVER (), 4) AS token_share,
    round(avg(kept::INT), 4)                        AS kept_share
FROM corpus
GROUP BY ALL
ORDER BY min(coalesce(n_tokens, -1))
