<?php
// Turns a PHPUnit JUnit XML log into one line per test, "PASS|FAIL|SKIP SUITE/test_name", the
// format conformance/clients/run.sh compares between brokers.
//   php junit2results.php SUITE junit.xml >> results.txt
declare(strict_types=1);

if ($argc < 3) {
    fwrite(STDERR, "usage: php junit2results.php SUITE junit.xml\n");
    exit(2);
}
[$_, $suite, $file] = $argv;
$xml = @simplexml_load_file($file);
if ($xml === false) {
    fwrite(STDERR, "junit2results: cannot read $file\n");
    exit(1);
}
foreach ($xml->xpath('//testcase') as $case) {
    $outcome = 'PASS';
    if (isset($case->failure) || isset($case->error)) {
        $outcome = 'FAIL';
    } elseif (isset($case->skipped)) {
        $outcome = 'SKIP';
    }
    echo "$outcome $suite/{$case['name']}\n";
}
