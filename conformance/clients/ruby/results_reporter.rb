# frozen_string_literal: true

# A Minitest plugin that writes one line per test, "PASS|FAIL|SKIP SUITE/test_name", to the file
# named by RESULTS_FILE: the format conformance/clients/run.sh compares between brokers.
# SUITE comes from SUITE_NAME (default "bunny").
require 'minitest'

module Minitest
  # Collects each test's outcome and appends them to RESULTS_FILE when the run ends.
  class ResultsFileReporter < AbstractReporter
    def initialize(path, suite)
      super()
      @path = path
      @suite = suite
      @lines = []
    end

    def record(result)
      outcome = if result.skipped? then 'SKIP'
                elsif result.passed? then 'PASS'
                else 'FAIL'
                end
      @lines << "#{outcome} #{@suite}/#{result.name}\n"
    end

    def report
      File.open(@path, 'a') { |f| f.write(@lines.join) }
    end
  end

  def self.plugin_results_file_init(_options)
    path = ENV.fetch('RESULTS_FILE', '')
    reporter << ResultsFileReporter.new(path, ENV.fetch('SUITE_NAME', 'bunny')) unless path.empty?
  end
end

Minitest.extensions << 'results_file'
