-- requires: contaminated, contaminated_with
-- Benchmark contamination (`contamination` asset): rows sharing a word 13-gram with a registered
-- evaluation set, by set; `kept_rows` must be 0 for training to run (a blocking check).
SELECT eval_set, count(*) AS rows, count(*) FILTER (WHERE kept) AS kept_rows
FROM (SELECT unnest(contaminated_with) AS eval_set, kept FROM corpus WHERE contaminated)
GROUP BY eval_set
UNION ALL
SELECT 'any set', count(*) FILTER (WHERE contaminated), count(*) FILTER (WHERE contaminated AND kept)
FROM corpus
ORDER BY rows DESC, eval_set
