-- Rows by educational-quality score bucket (floor of `score`), and what curation keeps of each.
SELECT
    coalesce(floor(score)::INT::VARCHAR, 'none')    AS score_bucket,
    count(*)                                        AS rows,
    round(count(*) / sum(count(*)) OVER (), 4)      AS share,
    round(avg(word_count), 1)                       AS mean_words,
    round(avg((is_dup OR near_dup)::INT), 4)        AS dup_rate,
    round(avg(kept::INT), 4)                        AS kept_share
FROM corpus
GROUP BY ALL
ORDER BY score_bucket
