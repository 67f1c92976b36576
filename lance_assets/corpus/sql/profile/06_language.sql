-- Language, by a heuristic: no language-ID model runs here. A document with at least two of
-- Gopher's English stop words (the, be, to, of, and, that, have, with) counts as English-like.
SELECT
    CASE WHEN stop_word_count >= 2 THEN 'English-like (>= 2 stop words)'
         WHEN stop_word_count IS NULL THEN 'not computed'
         ELSE 'other / no stop words' END           AS language,
    count(*)                                        AS rows,
    round(count(*) / sum(count(*)) OVER (), 4)      AS share,
    round(avg(kept::INT), 4)                        AS kept_share
FROM corpus
GROUP BY ALL
ORDER BY rows DESC
