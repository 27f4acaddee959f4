-- 020_content_hash.sql: the database-computed content hash.
--
-- content_hash = 'sha256:' || lowercase hex SHA-256 of the RFC 8785 (JCS) canonical
-- form of the content as stored in jsonb.  The Python twin is py/memfabric/hashing.py;
-- both are checked against tests/vectors/content_hash.json.
--
-- Replayed on every migrate: everything here is CREATE OR REPLACE.
-- Needs: schema fabric, a UTF8 database.
--
-- Why plain SQL string functions are enough: in a UTF8 database PostgreSQL's JSON string
-- escaping (escape_json, used by jsonb output and to_jsonb(text)::text) is exactly JCS:
-- only '"', '\' and characters below U+0020 are escaped, with the short forms \b \t \n \f
-- \r and \u00xx in lowercase hex for the rest; '/', U+007F, U+2028/U+2029 and characters
-- outside the BMP are emitted as literal UTF-8 (checked by tests/sql/test_content_hash.py).
-- What PostgreSQL does NOT do the JCS way: numbers (numeric text, not ECMAScript double
-- text) and object key order (jsonb orders keys by length, then bytes).

DO $guard$
BEGIN
  IF pg_catalog.current_setting('server_encoding') <> 'UTF8' THEN
    PERFORM fabric._raise_rule('feature_not_supported', 'fabric.content_hash needs a UTF8 database',
                               'create the database with ENCODING ''UTF8''');
  END IF;
END
$guard$;

-- ---------------------------------------------------------------------------------------
-- fabric._jcs_number
-- Formats a jsonb number as ECMAScript Number.prototype.toString of the IEEE double, and
-- refuses a number that is not exactly the shortest round-trip decimal of some double
-- (so the hash never silently depends on a rounding the writer did not see).
--
-- "Shortest" is meant as in ECMAScript, Python's repr and RFC 8785: a decimal lying
-- exactly on the rounding boundary counts when round-half-even reading maps it to the
-- double. PostgreSQL's float8out (Ryu built without STRICTLY_SHORTEST) never returns a
-- boundary decimal, so for some doubles at or above 2^53 it is one digit longer: 1e23
-- prints as 9.999999999999999e+22, 3.82201e20 as 3.8220099999999997e+20. Below 2^53 no
-- boundary decimal can be shorter than float8out's answer (a midpoint there needs at
-- least 17 significant digits), so the shorter boundary candidates are searched for only
-- at or above 2^53.
CREATE OR REPLACE FUNCTION fabric._jcs_number(n numeric)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
-- float8out is shortest-round-trip only when extra_float_digits > 0: pin it.
SET extra_float_digits = 1
AS $fn$
DECLARE
  a        numeric := abs(n);
  d        float8;   -- the double nearest to n (numeric -> float8 rounds half to even)
  shortest numeric;  -- its shortest round-trip decimal
  cand     numeric;
  t        text;     -- numeric text: never exponent notation
  dot      integer;
  ip       text;     -- integer part
  fp       text;     -- fraction part, trailing zeros removed
  digits   text;     -- significant digits, no leading or trailing zeros
  k        integer;  -- number of significant digits
  e        integer;  -- value = 0.digits * 10^e  (ECMAScript's n)
  body     text;
BEGIN
  IF n = 0 THEN
    RETURN '0';  -- numeric has no negative zero; -0 is 0 in JCS too
  END IF;
  -- The range checks come first so that no float8 cast can overflow or underflow: the
  -- cast's own error message would print the number. NaN and +-Infinity (impossible in
  -- jsonb, possible in a numeric argument) sort above every number.
  IF a > 1.7976931348623157e308 OR a < 5e-324 THEN
    PERFORM fabric._raise_rule('numeric_value_out_of_range',
      'content number is not exactly representable as an IEEE double',
      'send it as a string, or round it to at most 15-17 significant digits');
  END IF;
  d := a::float8;
  shortest := d::text::numeric;
  IF d >= 9007199254740992 THEN
    -- shortest is an integer here; try every shorter length, rounding down then up.
    t := shortest::text;
    e := length(t);
    k := length(rtrim(t, '0'));
    FOR j IN 1 .. k - 1 LOOP
      cand := trunc(shortest, j - e);
      IF cand::float8 = d THEN
        shortest := cand;
        EXIT;
      END IF;
      cand := cand + ('1e' || (e - j))::numeric;
      IF cand <= 1.7976931348623157e308 AND cand::float8 = d THEN
        shortest := cand;
        EXIT;
      END IF;
    END LOOP;
  END IF;
  IF shortest <> a THEN
    PERFORM fabric._raise_rule('numeric_value_out_of_range',
      'content number is not exactly representable as an IEEE double',
      'send it as a string, or round it to at most 15-17 significant digits');
  END IF;

  t := a::text;
  dot := strpos(t, '.');
  IF dot = 0 THEN
    ip := t;
    fp := '';
  ELSE
    ip := left(t, dot - 1);
    fp := rtrim(substr(t, dot + 1), '0');
  END IF;
  IF ip <> '0' THEN
    e := length(ip);
    digits := rtrim(ip || fp, '0');
  ELSE
    digits := ltrim(fp, '0');
    e := length(digits) - length(fp);  -- minus the count of leading zeros
  END IF;
  k := length(digits);

  -- ECMA-262 Number::toString, steps for k, n (= e) as in the spec.
  IF k <= e AND e <= 21 THEN
    body := digits || repeat('0', e - k);
  ELSIF 0 < e AND e <= 21 THEN
    body := left(digits, e) || '.' || substr(digits, e + 1);
  ELSIF -6 < e AND e <= 0 THEN
    body := '0.' || repeat('0', -e) || digits;
  ELSE
    body := left(digits, 1)
         || CASE WHEN k > 1 THEN '.' || substr(digits, 2) ELSE '' END
         || 'e' || CASE WHEN e > 0 THEN '+' ELSE '-' END || abs(e - 1)::text;
  END IF;

  IF n < 0 THEN
    RETURN '-' || body;
  END IF;
  RETURN body;
END
$fn$;

-- ---------------------------------------------------------------------------------------
-- fabric._jcs_key_order
-- Sort key for object keys: bytea whose byte order is the order of the key's UTF-16 code
-- units, as JCS requires (UTF-8 byte order is code point order, which differs for keys
-- with characters U+E000..U+FFFF versus U+10000 and above).
-- Each character of U+E000..U+FFFF becomes U+10FFFF followed by itself, and U+10FFFF
-- itself becomes U+10FFFF U+0001: a prefix-free, order-preserving recoding under which
-- code point order equals UTF-16 order. (plpgsql rather than SQL: a SQL function with a
-- SET clause is never inlined and is planned again on every call.)
CREATE OR REPLACE FUNCTION fabric._jcs_key_order(key text)
RETURNS bytea
LANGUAGE plpgsql
IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  RETURN convert_to(
    regexp_replace(
      replace(key, E'\U0010FFFF', E'\U0010FFFF\u0001'),
      E'([\uE000-\uFFFF])', E'\U0010FFFF\\1', 'g'),
    'UTF8');
END
$fn$;

-- ---------------------------------------------------------------------------------------
-- fabric.jcs_canonical
-- RFC 8785 canonical JSON text of a jsonb value: the exact bytes content_hash hashes.
-- This runs for every record formed, so the common shapes take no query: an object of at
-- most 64 ASCII keys gets its keys from one jsonpath call, in the object's own order (by
-- length, then bytes), and puts them in byte order -- UTF-16 order for ASCII -- by an
-- insertion sort; an array of at most 64 elements is walked by index. Any other object or
-- array takes one query (non-ASCII keys sorted by fabric._jcs_key_order). Integers within
-- +-2^53 print as numeric text (always exact and shortest); other numbers go to
-- fabric._jcs_number.
CREATE OR REPLACE FUNCTION fabric.jcs_canonical(doc jsonb)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  result text;
  key_list jsonb;
  keys text[];
  n integer;
  k text;
  j integer;
  v jsonb;
BEGIN
  CASE jsonb_typeof(doc)
  WHEN 'object' THEN
    key_list := jsonb_path_query_array(doc, 'strict $.keyvalue().key');
    n := jsonb_array_length(key_list);
    IF n <= 64 AND octet_length(key_list::text) = length(key_list::text) THEN
      -- ASCII keys (their JSON text is ASCII, so they are): insertion sort by bytes
      keys := '{}';
      FOR i IN 1 .. n LOOP
        k := key_list ->> (i - 1);
        j := i - 1;
        WHILE j > 0 AND keys[j] COLLATE "C" > k COLLATE "C" LOOP
          keys[j + 1] := keys[j];
          j := j - 1;
        END LOOP;
        keys[j + 1] := k;
      END LOOP;
      result := '{';
      FOR i IN 1 .. n LOOP
        v := doc -> keys[i];
        result := result || CASE WHEN i > 1 THEN ',' ELSE '' END
          || to_jsonb(keys[i])::text || ':'
          || CASE jsonb_typeof(v)
               WHEN 'string' THEN v::text  -- already JCS-escaped
               WHEN 'number' THEN
                 CASE WHEN scale(v::numeric) = 0 AND abs(v::numeric) <= 9007199254740992
                      THEN v::numeric::text
                      ELSE fabric._jcs_number(v::numeric) END
               WHEN 'object' THEN fabric.jcs_canonical(v)
               WHEN 'array'  THEN fabric.jcs_canonical(v)
               ELSE v::text  -- true, false, null
             END;
      END LOOP;
      RETURN result || '}';
    END IF;
    SELECT '{' || coalesce(string_agg(
             to_jsonb(m.key)::text || ':' ||
             CASE jsonb_typeof(m.value)
               WHEN 'string' THEN m.value::text  -- already JCS-escaped
               WHEN 'number' THEN
                 CASE WHEN scale(m.value::numeric) = 0
                       AND abs(m.value::numeric) <= 9007199254740992
                      THEN m.value::numeric::text
                      ELSE fabric._jcs_number(m.value::numeric) END
               WHEN 'object' THEN fabric.jcs_canonical(m.value)
               WHEN 'array'  THEN fabric.jcs_canonical(m.value)
               ELSE m.value::text  -- true, false, null
             END,
             ',' ORDER BY CASE WHEN octet_length(m.key) = length(m.key)
                               THEN convert_to(m.key, 'UTF8')
                               ELSE fabric._jcs_key_order(m.key) END), '') || '}'
      INTO result
      FROM jsonb_each(doc) AS m;
  WHEN 'array' THEN
    IF jsonb_array_length(doc) > 64 THEN
      -- a long array in one query (appending in a loop would copy the text once per element)
      SELECT '[' || coalesce(string_agg(
               CASE jsonb_typeof(a.value)
                 WHEN 'string' THEN a.value::text
                 WHEN 'number' THEN
                   CASE WHEN scale(a.value::numeric) = 0
                         AND abs(a.value::numeric) <= 9007199254740992
                        THEN a.value::numeric::text
                        ELSE fabric._jcs_number(a.value::numeric) END
                 WHEN 'object' THEN fabric.jcs_canonical(a.value)
                 WHEN 'array'  THEN fabric.jcs_canonical(a.value)
                 ELSE a.value::text
               END,
               ',' ORDER BY a.ord), '') || ']'
        INTO result
        FROM jsonb_array_elements(doc) WITH ORDINALITY AS a(value, ord);
      RETURN result;
    END IF;
    result := '[';
    FOR i IN 0 .. jsonb_array_length(doc) - 1 LOOP
      v := doc -> i;
      result := result || CASE WHEN i > 0 THEN ',' ELSE '' END
        || CASE jsonb_typeof(v)
             WHEN 'string' THEN v::text
             WHEN 'number' THEN
               CASE WHEN scale(v::numeric) = 0 AND abs(v::numeric) <= 9007199254740992
                    THEN v::numeric::text
                    ELSE fabric._jcs_number(v::numeric) END
             WHEN 'object' THEN fabric.jcs_canonical(v)
             WHEN 'array'  THEN fabric.jcs_canonical(v)
             ELSE v::text
           END;
    END LOOP;
    result := result || ']';
  WHEN 'number' THEN
    result := fabric._jcs_number(doc::numeric);
  ELSE
    result := doc::text;
  END CASE;
  RETURN result;
END
$fn$;

COMMENT ON FUNCTION fabric.jcs_canonical(jsonb) IS
  'RFC 8785 (JCS) canonical JSON text of the jsonb value: keys sorted by UTF-16 code units, '
  'ECMAScript number text, minimal escaping. Refuses (SQLSTATE 22003) a number that is not '
  'exactly the shortest round-trip decimal of an IEEE double.';

-- ---------------------------------------------------------------------------------------
-- fabric.content_hash
-- The content address of a memory: identical to memfabric.hashing.content_hash in Python.
-- (plpgsql for the same reason as _jcs_key_order: planned once per session, not per call.)
CREATE OR REPLACE FUNCTION fabric.content_hash(doc jsonb)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  RETURN 'sha256:' || encode(
    sha256(convert_to(fabric.jcs_canonical(doc), 'UTF8')), 'hex');
END
$fn$;

COMMENT ON FUNCTION fabric.content_hash(jsonb) IS
  '''sha256:'' || lowercase hex SHA-256 of fabric.jcs_canonical(content) in UTF-8. '
  'Same value as memfabric.hashing.content_hash in Python (tests/vectors/content_hash.json).';
