-- Language: the source's own label where it has one (FineWeb's `language`), else a heuristic
-- (no language-ID model runs here): at least two of Gopher's English stop words (the, be, to,
-- of, and, that, have, with) counts as English-like.
SELECT
    coalesce(language,
             CASE WHEN stop_word_count >= 2 THEN 'English-like (>= 2 stop words)'
                  WHEN stop_word_count IS NULL THEN 'not computed'
                  ELSE 'other / no stop words' END) AS language,
    CASE WHEN language IS NULL THEN 'stop-word heuristic' ELSE 'source label' END AS how,
    count(*)                                        AS rows,
    round(count(*) / sum(count(*)) OVER (), 4)      AS share,
    round(avg(kept::INT), 4)                        AS kept_share
FROM corpus
GROUP BY ALL
ORDER BY rows DESC
