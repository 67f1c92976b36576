-- Document length percentiles: characters, words, tokens.
SELECT 'characters' AS measure, quantile_disc(n_chars, [0.01, 0.1, 0.5, 0.9, 0.99]) AS p1_p10_p50_p90_p99,
       max(n_chars) AS max FROM corpus
UNION ALL
SELECT 'words', quantile_disc(word_count, [0.01, 0.1, 0.5, 0.9, 0.99]), max(word_count) FROM corpus
UNION ALL
SELECT 'tokens', quantile_disc(n_tokens, [0.01, 0.1, 0.5, 0.9, 0.99]), max(n_tokens) FROM corpus
