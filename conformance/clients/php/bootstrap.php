<?php
// PHPUnit bootstrap for Warren's php-amqplib conformance suite: loads Debian's php-amqplib and
// the shared test base class. The broker comes from WARREN_URL.
declare(strict_types=1);

require_once 'PhpAmqpLib/autoload.php'; // Debian's php-amqplib, on the default include_path
require_once __DIR__ . '/tests/ConformanceTestCase.php';
